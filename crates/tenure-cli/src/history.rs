//! The CLI's history events (docs/history.md): the guarded command of `tenure lease run`,
//! the example singleton's and entity's fenced writes, a proxy's answers and the load's, each
//! a `tracing` event on [`TARGET`] that the process's history writer, when installed, records.

use tenure::FencingToken;
use tenure::history::TARGET;

/// `command_started`: the command of `lease` started (`pid`: `None` when it had already
/// exited) while holding the grant `token`.
pub fn command_started(lease: &str, token: FencingToken, pid: Option<u32>) {
    tracing::info!(target: TARGET, event = "command_started", lease, token = token.get(), pid);
}

/// `command_stopped`: the command of `lease` run under `token` is gone, and why.
pub fn command_stopped(lease: &str, token: FencingToken, why: &str) {
    tracing::info!(target: TARGET, event = "command_stopped", lease, token = token.get(), why);
}

/// `write`: entity `entity` (of `entity_type`, in `shard`) wrote its fenced counter with
/// `token`; `value`: the counter after it, `None` when the counter refused the token.
pub fn write(
    entity_type: &str,
    shard: &str,
    entity: &str,
    token: FencingToken,
    value: Option<u64>,
) {
    tracing::info!(target: TARGET, event = "write", r#type = entity_type, shard, entity,
        token = token.get(), value, accepted = value.is_some());
}

/// `tick`: the singleton `singleton` wrote its fenced counter with `token`; `value` as for
/// [`write`].
pub fn tick(singleton: &str, token: FencingToken, value: Option<u64>) {
    tracing::info!(target: TARGET, event = "tick", singleton, token = token.get(), value,
        accepted = value.is_some());
}

/// `proxy_reply`: a proxy got the answer of `singleton`'s instance on `from`, running under
/// `token`, with the counter's `value`.
pub fn proxy_reply(singleton: &str, from: &str, token: FencingToken, value: Option<u64>) {
    tracing::info!(target: TARGET, event = "proxy_reply", singleton, from, token = token.get(),
        value);
}

/// `ack`: the increment of `entity` (in `shard`) sent at `issued` (ns, the history's clock)
/// was acknowledged by `from` with `value`, written under `token`.
pub fn ack(entity: &str, shard: &str, value: u64, token: FencingToken, from: &str, issued: i64) {
    tracing::info!(target: TARGET, event = "ack", entity, shard, value, token = token.get(),
        from, issued);
}

/// `no_ack`: the increment of `entity` (in `shard`) sent at `issued` ended unacknowledged,
/// and why.
pub fn no_ack(entity: &str, shard: &str, issued: i64, why: &str) {
    tracing::info!(target: TARGET, event = "no_ack", entity, shard, issued, why);
}

#[cfg(test)]
mod tests {
    use tenure::history::{Event, Recorder};

    use super::*;

    #[test]
    fn every_event_is_its_documented_kind() {
        let token = FencingToken::new(4);
        let recorder = Recorder::new("a:1", "1f");
        recorder.record(|| {
            command_started("job", token, Some(42));
            command_started("job", token, None);
            command_stopped("job", token, "exited");
            write("counter", "3", "key-1", token, Some(8));
            write("counter", "3", "key-1", token, None);
            tick("t", token, Some(9));
            tick("t", token, None);
            proxy_reply("t", "b:2", token, None);
            ack("key-1", "3", 8, token, "b:2", 17);
            no_ack("key-1", "3", 17, "timeout");
        });
        let (s, n) = (|v: &str| v.to_string(), None::<u64>);
        let expected = [
            Event::CommandStarted {
                lease: s("job"),
                token: 4,
                pid: Some(42),
            },
            Event::CommandStarted {
                lease: s("job"),
                token: 4,
                pid: None,
            },
            Event::CommandStopped {
                lease: s("job"),
                token: 4,
                why: s("exited"),
            },
            Event::Write {
                entity_type: s("counter"),
                shard: s("3"),
                entity: s("key-1"),
                token: 4,
                value: Some(8),
                accepted: true,
            },
            Event::Write {
                entity_type: s("counter"),
                shard: s("3"),
                entity: s("key-1"),
                token: 4,
                value: n,
                accepted: false,
            },
            Event::Tick {
                singleton: s("t"),
                token: 4,
                value: Some(9),
                accepted: true,
            },
            Event::Tick {
                singleton: s("t"),
                token: 4,
                value: n,
                accepted: false,
            },
            Event::ProxyReply {
                singleton: s("t"),
                from: s("b:2"),
                token: Some(4),
                value: n,
            },
            Event::Ack {
                entity: s("key-1"),
                shard: s("3"),
                value: 8,
                token: 4,
                from: s("b:2"),
                issued: Some(17),
            },
            Event::NoAck {
                entity: s("key-1"),
                shard: s("3"),
                issued: 17,
                why: s("timeout"),
            },
        ];
        assert_eq!(recorder.known_events(), Ok(expected.to_vec()));
    }
}
