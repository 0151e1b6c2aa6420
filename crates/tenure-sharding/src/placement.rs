//! The coordinator's durable placement: the shards an operator pinned, and a sharded
//! daemon's number of workers (its revision, and whether the workers of the earlier ones
//! are still being stopped), kept as ids
//! remembered with the coordinator's own singleton lease (the mechanism of
//! remember-entities, [`crate::remember`]), so that a coordinator that fails over finds
//! them again.
//!
//! **Where they live.** With the lease `<system>-singleton-sharding-<type>-coordinator`, in
//! its store: one id `pin/<shard>/<host:port>` per pinned shard. Like every remembered id
//! they never expire and outlive the grant (and the node) that wrote them, and only the
//! coordinator holding that lease's current grant can change them: a coordinator that lost
//! its lease, however late its write arrives, never changes the pins its successor reads.
//! A daemon's count is one id `daemon/<revision>/<count>/<running|stopping>`.
//!
//! **When they are read.** By each coordinator as it starts, with the listing of the shard
//! leases and before it allocates anything (see [`crate::coordinator`]).
//!
//! **When they change.** A pin adds its id (and removes the shard's previous one) and an
//! unpin removes it; the operator's answer waits until the change is written. A pin to a
//! node that is gone stays until it is unpinned: it never blocks its shard, which the
//! strategy places while that node cannot take it.

use std::collections::BTreeMap;

use tenure_lease::RememberChange;

use crate::messages::DaemonCount;

const PIN: &str = "pin/";
const DAEMON: &str = "daemon/";

/// The remembered id of `shard` pinned to `region`.
fn pin_id(shard: &str, region: &str) -> String {
    format!("{PIN}{shard}/{region}")
}

/// The pins among the ids remembered with the coordinator's lease: shard → region. Ids of
/// another kind are left out.
pub(crate) fn pins_of(ids: &[String]) -> BTreeMap<String, String> {
    ids.iter()
        .filter_map(|id| {
            let (shard, region) = id.strip_prefix(PIN)?.split_once('/')?;
            Some((shard.to_string(), region.to_string()))
        })
        .collect()
}

/// The change that moves the pin of `shard` from `from` to `to` (`None`: not pinned).
pub(crate) fn repin(shard: &str, from: Option<&str>, to: Option<&str>) -> RememberChange {
    let removed = RememberChange::remove(from.map(|r| pin_id(shard, r)));
    removed.then(RememberChange::add(to.map(|r| pin_id(shard, r))))
}

/// The remembered id of a daemon's `count`.
fn count_id(count: &DaemonCount) -> String {
    let phase = if count.stopping {
        "stopping"
    } else {
        "running"
    };
    format!("{DAEMON}{}/{}/{phase}", count.revision, count.count)
}

/// The daemon's count among the ids remembered with its coordinator's lease (the latest
/// revision, should a change have been applied in part), if one was stored.
pub(crate) fn count_of(ids: &[String]) -> Option<DaemonCount> {
    ids.iter()
        .filter_map(|id| {
            let mut parts = id.strip_prefix(DAEMON)?.split('/');
            let revision = parts.next()?.parse().ok()?;
            let count = parts.next()?.parse().ok()?;
            let stopping = match parts.next()? {
                "stopping" => true,
                "running" => false,
                _ => return None,
            };
            Some(DaemonCount {
                revision,
                count,
                stopping,
            })
        })
        .max_by_key(|c| (c.revision, !c.stopping))
}

/// The change that replaces the stored count `from` (if any) with `to`.
pub(crate) fn recount(from: Option<&DaemonCount>, to: &DaemonCount) -> RememberChange {
    RememberChange::remove(from.map(count_id)).then(RememberChange::add([count_id(to)]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_are_read_back_from_their_ids_and_other_ids_are_left_out() {
        let change = repin("7", Some("127.0.0.1:2"), Some("127.0.0.1:3"));
        assert_eq!(
            change.removed().iter().collect::<Vec<_>>(),
            ["pin/7/127.0.0.1:2"]
        );
        let mut ids: Vec<String> = change.added().iter().cloned().collect();
        ids.push("pin/12/[::1]:4".into());
        ids.push("count/3".into());
        assert_eq!(
            pins_of(&ids),
            BTreeMap::from([
                ("7".to_string(), "127.0.0.1:3".to_string()),
                ("12".to_string(), "[::1]:4".to_string()),
            ])
        );
        assert!(repin("7", None, None).is_empty());
    }

    #[test]
    fn a_daemon_count_is_read_back_and_pins_are_not_taken_for_one() {
        let first = DaemonCount {
            revision: 1,
            count: 4,
            stopping: true,
        };
        let done = DaemonCount {
            stopping: false,
            ..first
        };
        let mut ids: Vec<String> = recount(None, &first).added().iter().cloned().collect();
        ids.push("pin/3/127.0.0.1:2".into());
        assert_eq!(count_of(&ids), Some(first));
        let change = recount(Some(&first), &done);
        ids.retain(|id| !change.removed().contains(id));
        ids.extend(change.added().iter().cloned());
        assert_eq!(count_of(&ids), Some(done));
        assert_eq!(pins_of(&ids).len(), 1);
        assert_eq!(count_of(&["pin/3/127.0.0.1:2".to_string()]), None);
    }
}
