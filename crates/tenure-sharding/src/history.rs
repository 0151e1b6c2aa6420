//! The sharding layer's history events (docs/history.md, "Cluster, singleton and sharding
//! events"): a shard's and an entity's life under the shard's grant, and the coordinator's
//! moves, each a `tracing` event on [`TARGET`] that the process's history writer, when
//! installed, records.

use tenure_lease::FencingToken;
use tenure_lease::history::TARGET;

/// An emitter of a shard's life event: entity type, shard, token, why.
pub(crate) type ShardEvent = fn(&str, &str, FencingToken, &str);

/// An emitter of an entity's life event: entity type, shard, entity, token, why.
pub(crate) type EntityEvent = fn(&str, &str, &str, FencingToken, &str);

/// `shard_started`: `shard` of `entity_type` serves on this node under `token`.
pub(crate) fn shard_started(entity_type: &str, shard: &str, token: FencingToken, why: &str) {
    shard_life("shard_started", entity_type, shard, token, why);
}

/// `shard_stopped`: it stopped serving, and why.
pub(crate) fn shard_stopped(entity_type: &str, shard: &str, token: FencingToken, why: &str) {
    shard_life("shard_stopped", entity_type, shard, token, why);
}

/// `shard_lease_lost`: its lease, granted with `token`, was lost, and why.
pub(crate) fn shard_lease_lost(entity_type: &str, shard: &str, token: FencingToken, why: &str) {
    shard_life("shard_lease_lost", entity_type, shard, token, why);
}

fn shard_life(event: &str, entity_type: &str, shard: &str, token: FencingToken, why: &str) {
    tracing::info!(target: TARGET, event, r#type = entity_type, shard, token = token.get(), why);
}

/// `entity_started`: entity `entity` of `shard` is spawned under `token`; its `start` may
/// act from here.
pub(crate) fn entity_started(
    entity_type: &str,
    shard: &str,
    entity: &str,
    token: FencingToken,
    why: &str,
) {
    entity_life("entity_started", entity_type, shard, entity, token, why);
}

/// `entity_stopped`: it has terminated, and why.
pub(crate) fn entity_stopped(
    entity_type: &str,
    shard: &str,
    entity: &str,
    token: FencingToken,
    why: &str,
) {
    entity_life("entity_stopped", entity_type, shard, entity, token, why);
}

/// `entity_zombie`: it outlived its kill during a stop for `why` (its thread blocked
/// outside an await); it still runs, and the shard keeps it until it ends.
pub(crate) fn entity_zombie(
    entity_type: &str,
    shard: &str,
    entity: &str,
    token: FencingToken,
    why: &str,
) {
    entity_life("entity_zombie", entity_type, shard, entity, token, why);
}

fn entity_life(
    event: &str,
    entity_type: &str,
    shard: &str,
    entity: &str,
    token: FencingToken,
    why: &str,
) {
    tracing::info!(target: TARGET, event, r#type = entity_type, shard, entity,
        token = token.get(), why);
}

/// `shard_allocated`: the coordinator of `entity_type`, which had no home for `shard`,
/// told `to` to host it.
pub(crate) fn shard_allocated(entity_type: &str, shard: &str, to: &str) {
    tracing::info!(target: TARGET, event = "shard_allocated", r#type = entity_type, shard, to);
}

/// `region_allocatable`: whether the coordinator of `entity_type` on this node may give
/// `region`, running application `version`, shards from now on (it is registered,
/// available, up and reachable), when that changed; the newest-version filter is applied
/// after this.
pub(crate) fn region_allocatable(
    entity_type: &str,
    region: &str,
    version: &str,
    allocatable: bool,
) {
    tracing::info!(target: TARGET, event = "region_allocatable", r#type = entity_type, region,
        version, allocatable);
}

/// `shard_moving`: the coordinator of `entity_type` moves `shard` from `from` to `to` (a
/// rebalance); its hand-off begins.
pub(crate) fn shard_moving(entity_type: &str, shard: &str, from: &str, to: &str) {
    tracing::info!(target: TARGET, event = "shard_moving", r#type = entity_type, shard, from,
        to);
}

/// `shard_moved`: the hand-off of `shard` from `from` ended (`released`: its lease was
/// released) and its new home `to` was told (`None`: no region could take it).
pub(crate) fn shard_moved(
    entity_type: &str,
    shard: &str,
    from: &str,
    to: Option<&str>,
    released: bool,
) {
    tracing::info!(target: TARGET, event = "shard_moved", r#type = entity_type, shard, from, to,
        released);
}

/// Which durable entity an event is about, and the grant it runs under.
pub(crate) struct DurableAbout<'a> {
    pub(crate) entity_type: &'a str,
    pub(crate) shard: &'a str,
    pub(crate) entity: &'a str,
    pub(crate) token: FencingToken,
}

/// `journal_appended`: the entity's events `from_seq..=to_seq` are committed, fenced by its
/// grant; the append was sent at `issued`.
pub(crate) fn journal_appended(about: &DurableAbout<'_>, from_seq: u64, to_seq: u64, issued: i64) {
    tracing::info!(target: TARGET, event = "journal_appended", r#type = about.entity_type,
        shard = about.shard, entity = about.entity, token = about.token.get(), from_seq, to_seq,
        issued);
}

/// `journal_refused`: the journal refused the append expecting sequence number `seq`
/// (`reason`: `not_held` or `sequence`); nothing was written.
pub(crate) fn journal_refused(about: &DurableAbout<'_>, seq: u64, reason: &str, issued: i64) {
    tracing::info!(target: TARGET, event = "journal_refused", r#type = about.entity_type,
        shard = about.shard, entity = about.entity, token = about.token.get(), seq, reason,
        issued);
}

/// `entity_recovered`: the entity's state is recovered up to event `seq` (from the snapshot
/// at `snapshot`, if any), reading from `issued` on; `digest`: [`state_digest`] of the
/// state's encoding.
pub(crate) fn entity_recovered(
    about: &DurableAbout<'_>,
    seq: u64,
    snapshot: Option<u64>,
    issued: i64,
    digest: &str,
) {
    match snapshot {
        Some(snapshot) => tracing::info!(target: TARGET, event = "entity_recovered",
            r#type = about.entity_type, shard = about.shard, entity = about.entity,
            token = about.token.get(), seq, snapshot, issued, digest),
        None => tracing::info!(target: TARGET, event = "entity_recovered",
            r#type = about.entity_type, shard = about.shard, entity = about.entity,
            token = about.token.get(), seq, issued, digest),
    }
}

/// The FNV-1a 64 digest of `bytes` in 16 hex digits, as `tenure check` computes it
/// (`tenure_history::check::state_digest`).
pub(crate) fn state_digest(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use tenure_history::{EntityLife, Event, Recorder, ShardLife};

    use super::*;

    #[test]
    fn every_event_is_its_documented_kind() {
        let token = FencingToken::new(6);
        let recorder = Recorder::new("a:1", "1f");
        recorder.record(|| {
            shard_started("counter", "4", token, "");
            entity_started("counter", "4", "key-1", token, "");
            shard_lease_lost("counter", "4", token, "expired");
            entity_zombie("counter", "4", "key-1", token, "lease lost");
            entity_stopped("counter", "4", "key-1", token, "lease lost");
            shard_stopped("counter", "4", token, "lease lost: expired");
            shard_allocated("counter", "4", "a:1");
            region_allocatable("counter", "b:2", "1.0.0", true);
            shard_moving("counter", "4", "a:1", "b:2");
            shard_moved("counter", "4", "a:1", Some("b:2"), true);
            shard_moved("counter", "4", "a:1", None, false);
        });
        let s = |v: &str| v.to_string();
        let shard = |why: &str| ShardLife::new(s("counter"), s("4"), 6, s(why));
        let entity = |why: &str| EntityLife::new(s("counter"), s("4"), s("key-1"), 6, s(why));
        let moved = |to: Option<&str>, released| Event::ShardMoved {
            entity_type: s("counter"),
            shard: s("4"),
            from: s("a:1"),
            to: to.map(s),
            released,
        };
        let expected = [
            Event::ShardStarted(shard("")),
            Event::EntityStarted(entity("")),
            Event::ShardLeaseLost(shard("expired")),
            Event::EntityZombie(entity("lease lost")),
            Event::EntityStopped(entity("lease lost")),
            Event::ShardStopped(shard("lease lost: expired")),
            Event::ShardAllocated {
                entity_type: s("counter"),
                shard: s("4"),
                to: s("a:1"),
            },
            Event::RegionAllocatable {
                entity_type: s("counter"),
                region: s("b:2"),
                version: s("1.0.0"),
                allocatable: true,
            },
            Event::ShardMoving {
                entity_type: s("counter"),
                shard: s("4"),
                from: s("a:1"),
                to: s("b:2"),
            },
            moved(Some("b:2"), true),
            moved(None, false),
        ];
        assert_eq!(recorder.known_events(), Ok(expected.to_vec()));
    }

    #[test]
    fn durable_events_are_their_documented_kinds() {
        let recorder = Recorder::new("a:1", "1f");
        let about = DurableAbout {
            entity_type: "counter",
            shard: "4",
            entity: "key-1",
            token: FencingToken::new(6),
        };
        recorder.record(|| {
            entity_recovered(&about, 0, None, 5, "d0");
            entity_recovered(&about, 60, Some(50), 5, "d1");
            journal_appended(&about, 61, 62, 7);
            journal_refused(&about, 63, "not_held", 9);
        });
        let s = |v: &str| v.to_string();
        let recovered = |seq, snapshot, digest: &str| Event::EntityRecovered {
            entity_type: s("counter"),
            shard: s("4"),
            entity: s("key-1"),
            token: 6,
            seq,
            snapshot,
            issued: 5,
            digest: s(digest),
        };
        let expected = [
            recovered(0, None, "d0"),
            recovered(60, Some(50), "d1"),
            Event::JournalAppended {
                entity_type: s("counter"),
                shard: s("4"),
                entity: s("key-1"),
                token: 6,
                from_seq: 61,
                to_seq: 62,
                issued: 7,
            },
            Event::JournalRefused {
                entity_type: s("counter"),
                shard: s("4"),
                entity: s("key-1"),
                token: 6,
                seq: 63,
                reason: s("not_held"),
                issued: 9,
            },
        ];
        assert_eq!(recorder.known_events(), Ok(expected.to_vec()));
    }

    #[test]
    fn the_state_digest_is_the_checkers() {
        for bytes in [&b""[..], b"0", b"{\"items\":{}}"] {
            assert_eq!(
                state_digest(bytes),
                tenure_history::check::state_digest(bytes)
            );
        }
    }
}
