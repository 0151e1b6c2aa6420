//! The coordinator's durable placement: the shards an operator pinned, kept as ids
//! remembered with the coordinator's own singleton lease (the mechanism of
//! remember-entities, [`crate::remember`]), so that a coordinator that fails over finds
//! them again.
//!
//! **Where they live.** With the lease `<system>-singleton-sharding-<type>-coordinator`, in
//! its store: one id `pin/<shard>/<host:port>` per pinned shard. Like every remembered id
//! they never expire and outlive the grant (and the node) that wrote them, and only the
//! coordinator holding that lease's current grant can change them: a coordinator that lost
//! its lease, however late its write arrives, never changes the pins its successor reads.
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

const PIN: &str = "pin/";

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
}
