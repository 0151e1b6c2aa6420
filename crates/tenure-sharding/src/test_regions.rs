//! A test double of another node's region, for the unit tests of the routed and direct
//! paths and of the coordinator, and a proxy-only region whose coordinator never runs.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tenure_lease::TenureConfig;
use tenure_singleton::SingletonProxy;
use tokio::sync::mpsc::UnboundedSender;

use crate::messages::{CoordinatorMsg, Envelope, RegionMsg, Vacated};
use crate::region::{Region, RegionArgs};
use crate::{ShardRegion, ShardingSettings};

/// A proxy-only region of type `probe` on node `127.0.0.1:1`, with `config`, whose
/// coordinator never runs: no shard of it gets a home but those it is told of.
pub(crate) async fn proxy_region(scope: &str, config: &str) -> ShardRegion {
    let config = TenureConfig::from_toml_str(config, "test").unwrap();
    let settings = Arc::new(ShardingSettings::from_config(&config, "probe", "memory").unwrap());
    let coordinator =
        SingletonProxy::<CoordinatorMsg>::start(scope, "sharding-probe-coordinator", 10)
            .await
            .unwrap();
    let routes = Arc::new(crate::Routes::default());
    let readiness = tenure_cluster::Readiness::new().gate("region", "starting");
    let args = RegionArgs {
        type_name: "probe".into(),
        me: "127.0.0.1:1".into(),
        scope: scope.into(),
        system: "test".into(),
        settings: settings.clone(),
        hosting: None,
        coordinator: coordinator.clone(),
        routes: routes.clone(),

        readiness: readiness.clone(),
    };
    let (actor, _) = Actor::spawn(None, Region, args).await.unwrap();
    ShardRegion {
        type_name: "probe".into(),
        node: "127.0.0.1:1".into(),
        number_of_shards: settings.number_of_shards,
        actor,
        coordinator,
        routes,
        meters: crate::metrics::HandleMeters::new("probe"),
        readiness,
        requests: Default::default(),
    }
}

/// Another node's region: reports what `report` makes of each message it is sent (and
/// ignores the messages it makes nothing of).
pub(crate) struct RegionDouble<T> {
    report: Box<dyn Fn(RegionMsg) -> Option<T> + Send + Sync>,
    to: UnboundedSender<T>,
}

impl<T: Send + 'static> RegionDouble<T> {
    pub(crate) fn new(
        to: UnboundedSender<T>,
        report: impl Fn(RegionMsg) -> Option<T> + Send + Sync + 'static,
    ) -> Self {
        RegionDouble {
            report: Box::new(report),
            to,
        }
    }
}

impl RegionDouble<Envelope> {
    /// Reports the envelopes it is sent (tells and asks); answers `Vacate` (a barrier:
    /// everything sent to it before has been reported).
    pub(crate) fn envelopes(to: UnboundedSender<Envelope>) -> Self {
        RegionDouble::new(to, |msg| match msg {
            RegionMsg::Deliver(env) | RegionMsg::Ask(env, _) => Some(env),
            RegionMsg::Vacate(_, reply) => {
                let _ = reply.send(Vacated {
                    region: "127.0.0.1:2".into(),
                });
                None
            }
            _ => None,
        })
    }
}

impl<T: Send + 'static> Actor for RegionDouble<T> {
    type Msg = RegionMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<RegionMsg>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<RegionMsg>,
        msg: RegionMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        if let Some(report) = (self.report)(msg) {
            let _ = self.to.send(report);
        }
        Ok(())
    }
}
