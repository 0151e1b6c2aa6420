//! Sharded daemon process (Akka's `ShardedDaemonProcess`): `count` workers kept alive
//! across the cluster, each the only entity of its own shard, so each runs under its own
//! lease, with its own fencing token, on exactly one node at a time.
//!
//! Worker `i` lives in shard `i` of an entity type with `count` shards: the coordinator
//! spreads the workers over the nodes that host the type and moves them when nodes join,
//! leave or go down, as it does any shard. Every node that starts the daemon sends each
//! worker a keep-alive every `keep_alive` interval, which starts a worker that is not
//! running anywhere (after a hand-off or a crash) without any other traffic; workers are
//! never passivated. A node's keep-alives of one interval travel as one message to each
//! node hosting workers, naming them.
//!
//! Every node of the cluster must start the daemon with the same `name` and `count`: the
//! count is the type's number of shards, which decides where each worker lives.

use std::future::Future;
use std::time::Duration;

use ractor::ActorProcessingErr;
use serde::{Deserialize, Serialize};
use tenure_cluster::Node;
use tenure_lease::LeaseProvider;
use tokio::task::JoinHandle;

use crate::entity::{Entity, EntityContext, entity_factory, shard_of};
use crate::settings::ShardingSettings;
use crate::{ShardRegion, ShardingError};

/// What a daemon runs: worker `index` (of `count`), started under its shard's lease.
pub trait DaemonWorker: Send + Sync + 'static {
    /// The worker's state, built by `start`; typically the handle of the work it runs.
    type State: Send + 'static;

    /// Starts worker `index` on this node. `ctx.token` is the fencing token of its shard's
    /// grant: present it with every write the worker makes. An `Err` stops the worker; the
    /// next keep-alive starts it again.
    fn start(
        &self,
        index: usize,
        ctx: &EntityContext,
    ) -> impl Future<Output = Result<Self::State, ActorProcessingErr>> + Send;

    /// Stops worker `index` gracefully (hand-off, leave, lease lost). Not run when the
    /// worker is killed after `stop-timeout`.
    fn stop(
        &self,
        index: usize,
        ctx: &EntityContext,
        state: &mut Self::State,
    ) -> impl Future<Output = ()> + Send {
        let _ = (index, ctx, state);
        async {}
    }
}

/// The entity type of daemon `name`.
pub fn daemon_type(name: &str) -> String {
    format!("daemon-{name}")
}

/// The entity id of worker `index` of `count`: the first of `"<index>"`, `"<index>-1"`,
/// `"<index>-2"`, … that the default shard function maps to shard `index`, so that each
/// worker is alone in its shard. The same on every node and build.
pub fn worker_id(index: usize, count: usize) -> String {
    let target = index.to_string();
    (0u64..)
        .map(|k| {
            if k == 0 {
                target.clone()
            } else {
                format!("{index}-{k}")
            }
        })
        .find(|id| shard_of(id, count) == target)
        .unwrap_or_default()
}

/// The index of a worker from its entity id (see [`worker_id`]).
fn worker_index(entity_id: &str) -> Option<usize> {
    entity_id.split('-').next()?.parse().ok()
}

/// The message a worker gets: only keep-alives.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct KeepAlive;

struct Daemon<W> {
    worker: W,
}

impl<W: DaemonWorker> Entity for Daemon<W> {
    type Request = KeepAlive;
    type Reply = ();
    type State = (usize, W::State);

    async fn start(&self, ctx: &EntityContext) -> Result<Self::State, ActorProcessingErr> {
        let index = worker_index(&ctx.entity_id)
            .ok_or_else(|| format!("`{}` is not a worker id of a daemon", ctx.entity_id))?;
        Ok((index, self.worker.start(index, ctx).await?))
    }

    async fn handle(
        &self,
        _ctx: &EntityContext,
        _state: &mut Self::State,
        _request: KeepAlive,
    ) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn stop(&self, ctx: &EntityContext, state: &mut Self::State) {
        self.worker.stop(state.0, ctx, &mut state.1).await;
    }
}

/// A running sharded daemon process on this node: its region and its keep-alive pinger.
pub struct ShardedDaemon {
    region: ShardRegion,
    ids: Vec<String>,
    pinger: JoinHandle<()>,
}

impl ShardedDaemon {
    /// The daemon's shard region (its shard map shows where each worker runs).
    pub fn region(&self) -> &ShardRegion {
        &self.region
    }

    /// The entity ids of the workers, by index.
    pub fn worker_ids(&self) -> &[String] {
        &self.ids
    }

    /// Stops this node's part: its pinger, then its region (its workers hand off first).
    pub async fn stop(self) {
        self.pinger.abort();
        self.region.stop().await;
    }
}

/// Starts daemon `name` with `count` workers on `node`: settings from `[sharding]` /
/// `[sharding.daemon-<name>]` (the lease section, timeouts, role), except that the number
/// of shards is `count` and workers are never passivated. Workers run on nodes that host
/// the type; a node without the type's role only pings. `Err` when `count` is 0 (naming
/// the daemon) or the type cannot start.
pub async fn start_daemon<W: DaemonWorker>(
    node: &Node,
    provider: &LeaseProvider,
    name: &str,
    count: usize,
    worker: W,
    keep_alive: Duration,
) -> Result<ShardedDaemon, ShardingError> {
    let type_name = daemon_type(name);
    if count == 0 || keep_alive.is_zero() {
        return Err(ShardingError::Start {
            type_name,
            detail: format!(
                "a sharded daemon needs at least one worker and a keep-alive interval above zero (got {count} workers, keep-alive {keep_alive:?})"
            ),
        });
    }
    let mut settings = ShardingSettings::from_config(
        provider.config(),
        &type_name,
        &node.settings().lease_section,
    )?;
    settings.number_of_shards = count;
    settings.idle_timeout = None;
    let factory = entity_factory(Daemon { worker });
    let region =
        crate::start_with_settings(node, provider, &type_name, Some(factory), None, settings)
            .await?;
    let ids: Vec<String> = (0..count).map(|i| worker_id(i, count)).collect();
    let pinger = {
        let region = region.clone();
        let ids = ids.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(keep_alive);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                keep_alive_round(&region, &ids);
            }
        })
    };
    Ok(ShardedDaemon {
        region,
        ids,
        pinger,
    })
}

/// One round of keep-alives from this node to the workers `ids`: one message to each node
/// that hosts some of them (with their ids), not one per worker.
fn keep_alive_round(region: &ShardRegion, ids: &[String]) {
    if let Err(e) = region.tell_each(ids, &KeepAlive) {
        tracing::debug!(daemon = %region.type_name(), error = %e, "keep-alives not sent");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ractor::Actor;
    use tenure_cluster::{ClusterEvent, Member, MemberStatus};
    use tenure_lease::FencingToken;

    use super::*;
    use crate::messages::{RegionLocal, RegionMsg, ShardHome, Vacated, Vacating};
    use crate::test_regions::{RegionDouble, proxy_region};

    fn member(addr: &str) -> Member {
        Member {
            addr: tenure_cluster::NodeAddr::parse("member", addr).unwrap(),
            incarnation: tenure_cluster::Incarnation(1),
            age: 1,
            status: MemberStatus::Up,
            reachable: true,
            roles: Vec::new(),
            app_version: Default::default(),
        }
    }

    /// Each round of keep-alives reaches each node hosting workers in one message that
    /// names its workers there, not in one message per worker.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_keep_alive_round_sends_one_message_per_node() {
        let scope = "daemon-keep-alive-rounds";
        let count = 20;
        let region = proxy_region(scope, &format!("[sharding]\nnumber-of-shards = {count}")).await;
        let nodes = ["127.0.0.1:2", "127.0.0.1:3"];
        // Per node: the entity ids of each message it got.
        let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
        let mut doubles = Vec::new();
        for node in nodes {
            let double = RegionDouble::new(tx.clone(), move |msg| match msg {
                RegionMsg::Deliver(env) => Some((node, vec![env.entity])),
                RegionMsg::DeliverAll(crate::messages::Envelopes { envelopes }) => {
                    Some((node, envelopes.into_iter().map(|e| e.entity).collect()))
                }
                RegionMsg::Vacate(_, reply) => {
                    let _ = reply.send(Vacated {
                        region: node.into(),
                    });
                    None
                }
                _ => Some((node, Vec::new())),
            });
            let (actor, _) = Actor::spawn(None, double, ()).await.unwrap();
            ractor::pg::join_scoped(
                scope.to_string(),
                crate::region::region_group("probe", node),
                vec![actor.get_cell()],
            );
            doubles.push(actor);
        }
        let cast = |msg: RegionMsg| region.actor().cast(msg).unwrap();
        cast(RegionMsg::Local(RegionLocal::Cluster(
            ClusterEvent::CurrentMembers(nodes.iter().map(|n| member(n)).collect()),
        )));
        for shard in 0..count {
            cast(RegionMsg::Home(ShardHome {
                shard: shard.to_string(),
                home: Some(nodes[shard % 2].into()),
                coordinator: FencingToken::new(1),
            }));
        }
        let ids: Vec<String> = (0..count).map(|i| worker_id(i, count)).collect();
        let rounds = 3;
        for _ in 0..rounds {
            keep_alive_round(&region, &ids);
        }
        // Everything the region forwarded has been handled by the doubles.
        ractor::call!(region.actor(), |r| RegionMsg::Local(RegionLocal::Snapshot(
            r
        )))
        .unwrap();
        for (double, node) in doubles.iter().zip(nodes) {
            ractor::call!(double, |r| RegionMsg::Vacate(
                Vacating { node: node.into() },
                r
            ))
            .unwrap();
        }
        let mut messages: BTreeMap<&str, usize> = BTreeMap::new();
        let mut reached: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        while let Ok((node, entities)) = heard.try_recv() {
            *messages.entry(node).or_default() += 1;
            reached.entry(node).or_default().extend(entities);
        }
        assert_eq!(
            messages,
            nodes.iter().map(|n| (*n, rounds)).collect(),
            "messages per node for {rounds} rounds of keep-alives to {count} workers"
        );
        for (i, node) in nodes.iter().enumerate() {
            let mut expected: Vec<String> = (0..rounds)
                .flat_map(|_| ids.iter().skip(i).step_by(2).cloned())
                .collect();
            expected.sort();
            let mut got = reached[node].clone();
            got.sort();
            assert_eq!(got, expected, "the workers kept alive on {node}");
        }
        region.actor().stop_and_wait(None, None).await.unwrap();
        for d in doubles {
            d.stop(None);
        }
    }

    #[test]
    fn each_worker_is_alone_in_its_own_shard() {
        for count in [1, 2, 3, 7, 16, 100] {
            let ids: Vec<String> = (0..count).map(|i| worker_id(i, count)).collect();
            for (i, id) in ids.iter().enumerate() {
                assert_eq!(shard_of(id, count), i.to_string(), "worker {i} of {count}");
                assert_eq!(worker_index(id), Some(i));
            }
        }
    }
}
