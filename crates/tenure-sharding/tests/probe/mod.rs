//! What the tests that drive one shard directly share: an entity that reports its life and
//! every message, starting the one shard of its type, and asking, telling and reading the
//! status of a shard.

// Not every test binary that includes this module uses all of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use tenure_lease::{FencingToken, LeaseSpec, LeaseStore, ProcessEnd, TenureConfig};
use tenure_lease_kit::conformance::holder_test_settings;
use tenure_sharding::{
    AskReply, Entity, EntityContext, EntityFactory, Shard, ShardArgs, ShardMsg, ShardStatus,
    ShardingSettings,
};
use tokio::sync::mpsc;

/// The lease of the one shard (`0`) of entity type `probe`.
pub const LEASE: &str = "test-shard-probe-0";

/// What happened to an entity, with the token of its shard's grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// It started.
    Started(String, FencingToken),
    /// It stopped.
    Stopped(String, FencingToken),
    /// It handled a request.
    Got(String, FencingToken, String),
}

/// Reports its life and every message; `"passivate"` makes it ask to be passivated,
/// `"fail"` fails the request (which stops it), `"slow"` takes 60 ms to answer.
pub struct Probe(pub mpsc::UnboundedSender<Seen>);

impl Entity for Probe {
    type Request = String;
    type Reply = String;
    type State = ();

    async fn start(&self, ctx: &EntityContext) -> Result<(), ActorProcessingErr> {
        let _ = self.0.send(Seen::Started(ctx.entity_id.clone(), ctx.token));
        Ok(())
    }

    async fn handle(
        &self,
        ctx: &EntityContext,
        _state: &mut (),
        request: String,
    ) -> Result<String, ActorProcessingErr> {
        let _ = self
            .0
            .send(Seen::Got(ctx.entity_id.clone(), ctx.token, request.clone()));
        match request.as_str() {
            "passivate" => ctx.passivate(),
            "fail" => return Err("asked to fail".into()),
            // Well inside the fixtures' 300 ms stop-timeout, so a drain can finish.
            "slow" => tokio::time::sleep(Duration::from_millis(60)).await,
            _ => {}
        }
        Ok(format!("{}:{request}", ctx.entity_id))
    }

    async fn stop(&self, ctx: &EntityContext, _state: &mut ()) {
        let _ = self.0.send(Seen::Stopped(ctx.entity_id.clone(), ctx.token));
    }
}

/// The settings of entity type `probe` read from `toml` (`""`: the defaults), with one
/// shard (every id belongs to it), the kit's holder lease timings, and a stop budget
/// (300 ms + 500 ms of kill wait and slack) that fits their 1.5 s ttl.
pub fn one_shard_settings(toml: &str) -> ShardingSettings {
    let config = TenureConfig::from_toml_str(toml, "test").unwrap();
    let mut settings = ShardingSettings::from_config(&config, "probe", "memory").unwrap();
    settings.number_of_shards = 1;
    settings.stop_timeout = Duration::from_millis(300);
    settings.lease = holder_test_settings();
    settings
}

/// Starts shard `0` of `probe` on node `owner` under `settings`, its lease [`LEASE`] in
/// `store`, its entities made by `factory`, the process ended by `process_end`.
pub async fn start_shard(
    owner: &str,
    settings: ShardingSettings,
    store: Arc<dyn LeaseStore>,
    factory: EntityFactory,
    process_end: ProcessEnd,
) -> ActorRef<ShardMsg> {
    let args = ShardArgs {
        type_name: "probe".into(),
        shard_id: "0".into(),
        node: owner.into(),
        lease: LeaseSpec::new(LEASE, owner, store, settings.lease).unwrap(),
        factory,
        active: None,
        settings: Arc::new(settings),
        process_end,
    };
    Shard::start(args, None).await.unwrap()
}

/// `text` as a request of entity type `probe`, encoded.
pub fn payload(text: &str) -> Vec<u8> {
    tenure_cluster::codec::encode_inner("entity request", "probe", &text.to_string()).unwrap()
}

/// Tells `text` to `entity` through `shard`.
pub fn tell(shard: &ActorRef<ShardMsg>, entity: &str, text: &str) {
    shard
        .cast(ShardMsg::Deliver {
            entity: entity.into(),
            payload: payload(text),
            reply: None,
        })
        .unwrap();
}

/// Asks `entity` `text` through `shard`: its answer, or the error it failed with.
pub async fn ask(shard: &ActorRef<ShardMsg>, entity: &str, text: &str) -> Result<String, String> {
    let reply = shard
        .call(
            |r: RpcReplyPort<AskReply>| ShardMsg::Deliver {
                entity: entity.into(),
                payload: payload(text),
                reply: Some(r),
            },
            Some(Duration::from_secs(10)),
        )
        .await
        .unwrap();
    let ractor::rpc::CallResult::Success(AskReply { result }) = reply else {
        panic!("no answer");
    };
    result
        .map(|b| tenure_cluster::codec::decode_inner("entity request", "probe", &b).unwrap())
        .map_err(|e| e.to_string())
}

/// The shard's status.
pub async fn status(shard: &ActorRef<ShardMsg>) -> ShardStatus {
    ractor::call!(shard, ShardMsg::Status).unwrap()
}
