//! The singleton layer's history events (docs/history.md, "Cluster, singleton and sharding
//! events"): an instance's life under its grant, each a `tracing` event on [`TARGET`] that
//! the process's history writer, when installed, records.

use tenure_lease::FencingToken;
use tenure_lease::history::TARGET;

/// `singleton_starting`: the instance of `singleton` is spawned under `token`; its
/// `pre_start` may act from here.
pub(crate) fn singleton_starting(singleton: &str, token: FencingToken, why: &str) {
    life("singleton_starting", singleton, token, why);
}

/// `singleton_started`: its `pre_start` finished.
pub(crate) fn singleton_started(singleton: &str, token: FencingToken, why: &str) {
    life("singleton_started", singleton, token, why);
}

/// `singleton_stopped`: it and its descendants have terminated, and why.
pub(crate) fn singleton_stopped(singleton: &str, token: FencingToken, why: &str) {
    life("singleton_stopped", singleton, token, why);
}

/// `singleton_zombie`: one of them survived its kill.
pub(crate) fn singleton_zombie(singleton: &str, token: FencingToken, why: &str) {
    life("singleton_zombie", singleton, token, why);
}

/// `singleton_lease_lost`: the singleton's lease, granted with `token`, was lost, and why.
pub(crate) fn singleton_lease_lost(singleton: &str, token: FencingToken, why: &str) {
    life("singleton_lease_lost", singleton, token, why);
}

fn life(event: &str, singleton: &str, token: FencingToken, why: &str) {
    tracing::info!(target: TARGET, event, singleton, token = token.get(), why);
}

#[cfg(test)]
mod tests {
    use tenure_history::{Event, Recorder, SingletonLife};

    use super::*;

    #[test]
    fn every_event_is_its_documented_kind() {
        let token = FencingToken::new(5);
        let recorder = Recorder::new("a:1", "1f");
        recorder.record(|| {
            singleton_starting("t", token, "");
            singleton_started("t", token, "");
            singleton_lease_lost("t", token, "expired");
            singleton_zombie("t", token, "killed");
            singleton_stopped("t", token, "lease lost");
        });
        let life = |why: &str| SingletonLife::new("t".into(), 5, why.into());
        let expected = [
            Event::SingletonStarting(life("")),
            Event::SingletonStarted(life("")),
            Event::SingletonLeaseLost(life("expired")),
            Event::SingletonZombie(life("killed")),
            Event::SingletonStopped(life("lease lost")),
        ];
        assert_eq!(recorder.known_events(), Ok(expected.to_vec()));
    }
}
