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
//! Every node of the cluster must start the daemon with the same `name` and `count`. The
//! count can change at run time ([`ShardedDaemon::resize`], [`resize`]; Akka's
//! `ShardedDaemonProcess` resize): the type's coordinator stores the new count with a new
//! revision (with its own lease in the store, like pins: a fail-over keeps it), hands off
//! every worker's shard, so that each old worker stops under its lease, and allocates
//! nothing until all have stopped; then the new revision's workers start. A worker's id
//! names its index, count and revision, and a worker starts only while the coordinator
//! says its revision runs: no two workers ever own one index under different counts. The
//! keep-alives follow the coordinator's count, which every node's pinger asks each round.
//!
//! The type's `number-of-shards` (`[sharding.daemon-<name>]`, at least `count`) is the
//! most workers a resize may ask for: worker `i` always lives in shard `i`.

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ractor::ActorProcessingErr;
use serde::{Deserialize, Serialize};
use tenure_cluster::Node;
use tenure_lease::LeaseProvider;
use tokio::task::JoinHandle;

pub use crate::messages::DaemonCount;

use crate::entity::{Entity, EntityContext, entity_factory, shard_of};
use crate::messages::{CoordinatorMsg, DaemonCountRequest, ResizeDaemon};
use crate::settings::ShardingSettings;
use crate::{ShardRegion, ShardingError};

/// What a daemon runs: worker `index` of `count`, started under its shard's lease.
pub trait DaemonWorker: Send + Sync + 'static {
    /// The worker's state, built by `start`; typically the handle of the work it runs.
    type State: Send + 'static;

    /// Starts worker `index` of `count` on this node. `ctx.token` is the fencing token of
    /// its shard's grant: present it with every write the worker makes. No worker of
    /// another count runs with the same index meanwhile. An `Err` stops the worker; the
    /// next keep-alive starts it again.
    fn start(
        &self,
        index: usize,
        count: usize,
        ctx: &EntityContext,
    ) -> impl Future<Output = Result<Self::State, ActorProcessingErr>> + Send;

    /// Stops worker `index` of `count` gracefully (hand-off, resize, leave, lease lost).
    /// Not run when the worker is killed after `stop-timeout`.
    fn stop(
        &self,
        index: usize,
        count: usize,
        ctx: &EntityContext,
        state: &mut Self::State,
    ) -> impl Future<Output = ()> + Send {
        let _ = (index, count, ctx, state);
        async {}
    }
}

/// The entity type of daemon `name`.
pub fn daemon_type(name: &str) -> String {
    format!("daemon-{name}")
}

/// The entity id of worker `index` of `count` at `revision`, for a type of `shards`
/// shards: the first of `"<index>-<count>-<revision>"`, `"<index>-<count>-<revision>-1"`,
/// … that the default shard function maps to shard `index`, so that each worker is alone
/// in its shard. The same on every node and build.
pub fn worker_id(index: usize, count: usize, revision: u64, shards: usize) -> String {
    let base = format!("{index}-{count}-{revision}");
    let target = index.to_string();
    (0u64..)
        .map(|k| {
            if k == 0 {
                base.clone()
            } else {
                format!("{base}-{k}")
            }
        })
        .find(|id| shard_of(id, shards) == target)
        .unwrap_or_default()
}

/// The index, count and revision of a worker from its entity id (see [`worker_id`]).
fn parse_worker(entity_id: &str) -> Option<(usize, usize, u64)> {
    let mut parts = entity_id.split('-');
    Some((
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
    ))
}

/// The ids of the workers of `count` at its revision, by index.
fn worker_ids(count: &DaemonCount, shards: usize) -> Vec<String> {
    (0..count.count)
        .map(|i| worker_id(i, count.count, count.revision, shards))
        .collect()
}

/// The message a worker gets: only keep-alives.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct KeepAlive;

struct Daemon<W> {
    worker: W,
    /// This node's region of the daemon's type, set once it started.
    region: Arc<OnceLock<ShardRegion>>,
    /// How long a starting worker waits for the coordinator's count.
    ask: Duration,
}

impl<W: DaemonWorker> Entity for Daemon<W> {
    type Request = KeepAlive;
    type Reply = ();
    type State = (usize, usize, W::State);

    async fn start(&self, ctx: &EntityContext) -> Result<Self::State, ActorProcessingErr> {
        let id = &ctx.entity_id;
        let (index, count, revision) =
            parse_worker(id).ok_or_else(|| format!("`{id}` is not a worker id of a daemon"))?;
        let region = self
            .region
            .get()
            .ok_or_else(|| format!("worker `{id}`: the daemon's region is still starting"))?;
        // Only while the coordinator says this revision runs: a keep-alive sent before a
        // resize (buffered, or from a node that has not heard of it) never starts an old
        // worker next to the new ones.
        let current = count_of(region, self.ask).await?;
        let runs =
            current.is_some_and(|c| c.revision == revision && c.count == count && !c.stopping);
        if !runs {
            return Err(format!(
                "worker `{id}` (index {index} of {count}, revision {revision}) not started: the daemon's coordinator says {current:?}"
            )
            .into());
        }
        Ok((index, count, self.worker.start(index, count, ctx).await?))
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
        self.worker.stop(state.0, state.1, ctx, &mut state.2).await;
    }
}

/// A running sharded daemon process on this node: its region and its keep-alive pinger.
pub struct ShardedDaemon {
    name: String,
    region: ShardRegion,
    /// The workers this node keeps alive, and the count they belong to.
    pinged: Arc<Mutex<(DaemonCount, Vec<String>)>>,
    pinger: JoinHandle<()>,
}

impl ShardedDaemon {
    /// The daemon's shard region (its shard map shows where each worker runs).
    pub fn region(&self) -> &ShardRegion {
        &self.region
    }

    /// The entity ids of the workers this node keeps alive, by index (those of the count
    /// the coordinator last told it).
    pub fn worker_ids(&self) -> Vec<String> {
        self.pinged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    /// Resizes the daemon to `count` workers (see [`resize`]).
    pub async fn resize(&self, count: usize, timeout: Duration) -> Result<bool, ShardingError> {
        resize(&self.region, count, timeout).await
    }

    /// The daemon's count as its coordinator keeps it (see [`current_count`]).
    pub async fn current_count(
        &self,
        timeout: Duration,
    ) -> Result<Option<DaemonCount>, ShardingError> {
        current_count(&self.region, timeout).await
    }

    /// The daemon's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Stops this node's part: its pinger, then its region (its workers hand off first).
    pub async fn stop(self) {
        self.pinger.abort();
        self.region.stop().await;
    }
}

/// The daemon's name from its region's type.
fn daemon_name(region: &ShardRegion) -> String {
    let type_name = region.type_name();
    type_name
        .strip_prefix("daemon-")
        .unwrap_or(type_name)
        .to_string()
}

/// Resizes the daemon whose region is `region` (of type [`daemon_type`]) to `count`
/// workers at run time: every worker of the current count stops, under its lease, before
/// any of the new count starts, and the new count survives a coordinator fail-over.
/// `Ok(true)`: the resize began (it ends once the new workers run, see [`current_count`]);
/// `Ok(false)`: it runs `count` workers already. `Err(WorkerCount)`: `count` is 0 or above
/// the type's `number-of-shards`, naming the daemon and the count; `Err(Resize)`: the
/// coordinator refused (a resize still in progress, the count could not be stored, the
/// type is not a daemon's); `Err(NoCoordinator)`: none answered within `timeout` (the
/// resize may or may not have begun: ask [`current_count`]). Nothing changed on the other errors.
pub async fn resize(
    region: &ShardRegion,
    count: usize,
    timeout: Duration,
) -> Result<bool, ShardingError> {
    let daemon = daemon_name(region);
    let maximum = region.number_of_shards;
    if count == 0 || count > maximum {
        return Err(ShardingError::WorkerCount {
            daemon,
            count,
            maximum,
        });
    }
    match region
        .coordinator
        .call(
            |r| CoordinatorMsg::ResizeDaemon(ResizeDaemon { count }, r),
            timeout,
        )
        .await
    {
        Ok(reply) => reply.result.map_err(|detail| ShardingError::Resize {
            daemon,
            count,
            detail,
        }),
        Err(_) => Err(ShardingError::NoCoordinator {
            type_name: region.type_name().to_string(),
            timeout,
        }),
    }
}

/// The daemon's count as its coordinator keeps it (`None`: the coordinator has not read it
/// from the store yet, or `region`'s type is not a daemon's); `Err(NoCoordinator)` when
/// none answered within `timeout`.
pub async fn current_count(
    region: &ShardRegion,
    timeout: Duration,
) -> Result<Option<DaemonCount>, ShardingError> {
    region
        .coordinator
        .call(
            |r| CoordinatorMsg::GetDaemonCount(DaemonCountRequest {}, r),
            timeout,
        )
        .await
        .map(|reply| reply.count)
        .map_err(|_| ShardingError::NoCoordinator {
            type_name: region.type_name().to_string(),
            timeout,
        })
}

/// [`count`] for a starting worker, its error as text.
async fn count_of(
    region: &ShardRegion,
    timeout: Duration,
) -> Result<Option<DaemonCount>, ActorProcessingErr> {
    current_count(region, timeout)
        .await
        .map_err(|e| e.to_string().into())
}

/// Starts daemon `name` with `count` workers on `node`: settings from `[sharding]` /
/// `[sharding.daemon-<name>]` (the lease section, timeouts, role, and `number-of-shards`,
/// the most workers a [`resize`] may ask for: at least `count`), except that workers are
/// never passivated. Workers run on nodes that host the type; a node without the type's
/// role only pings. The count is the coordinator's once a resize was stored. `Err` when
/// `count` is 0 (naming the daemon) or the type cannot start.
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
    settings.number_of_shards = settings.number_of_shards.max(count);
    settings.idle_timeout = None;
    let shards = settings.number_of_shards;
    let slot = Arc::new(OnceLock::new());
    let factory = entity_factory(Daemon {
        worker,
        region: slot.clone(),
        ask: keep_alive.max(Duration::from_secs(1)),
    });
    let region = crate::start_with_settings(
        node,
        provider,
        &type_name,
        Some(factory),
        None,
        settings,
        Some(count),
    )
    .await?;
    let _ = slot.set(region.clone());
    let first = DaemonCount {
        revision: 0,
        count,
        stopping: false,
    };
    let pinged = Arc::new(Mutex::new((first, worker_ids(&first, shards))));
    let pinger = {
        let (region, pinged) = (region.clone(), pinged.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(keep_alive);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let ids = match current_count(&region, keep_alive).await {
                    Ok(Some(now)) if !now.stopping => {
                        let mut p = pinged.lock().unwrap_or_else(|e| e.into_inner());
                        if p.0 != now {
                            *p = (now, worker_ids(&now, shards));
                        }
                        p.1.clone()
                    }
                    // Resizing, or not known: no keep-alive this round (a worker of a
                    // count that does not run would not start anyway).
                    Ok(_) | Err(_) => continue,
                };
                keep_alive_round(&region, &ids);
            }
        })
    };
    Ok(ShardedDaemon {
        name: name.to_string(),
        region,
        pinged,
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
        let ids: Vec<String> = (0..count).map(|i| worker_id(i, count, 0, count)).collect();
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
        for (count, shards) in [(1, 1), (2, 2), (3, 100), (7, 7), (16, 100), (100, 100)] {
            for revision in [0, 3] {
                for i in 0..count {
                    let id = worker_id(i, count, revision, shards);
                    assert_eq!(
                        shard_of(&id, shards),
                        i.to_string(),
                        "worker {i} of {count}"
                    );
                    assert_eq!(parse_worker(&id), Some((i, count, revision)));
                }
            }
        }
    }
}
