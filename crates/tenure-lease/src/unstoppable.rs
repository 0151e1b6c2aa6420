//! What cannot be stopped ends the process. A supervisor stops what it runs under a lease
//! (entities, a singleton instance) within its [stop budget](crate::StopBudget): a graceful
//! stop, then a kill. Code that blocks a thread outside an await outlives an actor kill, and
//! under a lease being lost it must not run on once another holder may be granted the lease.
//! So, by default, the process ends before the lease's local deadline (`abort(3)`), as HBase
//! region servers and Chubby clients end themselves when their session is gone; the
//! process's death ends the blocked thread with it, and the lease expires in the store.
//!
//! Graceful moves (a hand-off, a leave) never end the process: they keep the lease, renewed,
//! until what outlived its kill has ended.

use std::sync::Arc;

use serde::Deserialize;

use crate::token::FencingToken;

/// `when-kill-fails` (in `[sharding]` and `[singleton]`): what a supervisor does when
/// something it runs under a lease that is being lost outlives its kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WhenKillFails {
    /// `"abort"`: log it with what outlived its kill, its lease and token, record it in the
    /// history (`process_abort`), and end the process with `abort(3)` (SIGABRT: exit status
    /// 134 in a shell) before the lease's local deadline.
    #[default]
    Abort,
    /// `"run-on-unsafe"`: log it and let it run on. UNSAFE: once the local deadline has
    /// passed another holder may be granted the lease and act while this one still does;
    /// only resources that check fencing tokens stay protected.
    RunOnUnsafe,
}

/// Something that outlived its kill under a lease being lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unstoppable {
    /// The lease it runs under.
    pub lease: String,
    /// The token of the grant it runs under.
    pub token: FencingToken,
    /// What it is, for people: e.g. `entity key-7 of counter shard 3`.
    pub what: String,
}

impl std::fmt::Display for Unstoppable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (lease {}, token {})",
            self.what,
            self.lease,
            self.token.get()
        )
    }
}

/// How a supervisor ends the process when something outlived its kill under a lease being
/// lost ([`WhenKillFails::Abort`]): [`ProcessEnd::abort`] by default; tests give a hook
/// instead.
#[derive(Clone)]
pub struct ProcessEnd(Arc<dyn Fn(&Unstoppable) + Send + Sync>);

impl ProcessEnd {
    /// Ends the process at once with [`std::process::abort`]: no destructor, no flush, no
    /// await; every thread, the blocked one included, ends with it.
    pub fn abort() -> Self {
        ProcessEnd(Arc::new(|_| std::process::abort()))
    }

    /// Calls `hook` instead of ending the process: for tests. The supervisor goes on once it
    /// returns, as with [`WhenKillFails::RunOnUnsafe`].
    pub fn with_hook(hook: impl Fn(&Unstoppable) + Send + Sync + 'static) -> Self {
        ProcessEnd(Arc::new(hook))
    }

    /// Ends the process because of `what`; returns only with a hook. The caller has
    /// logged and recorded it already.
    pub fn end(&self, what: &Unstoppable) {
        (self.0)(what)
    }
}

impl Default for ProcessEnd {
    fn default() -> Self {
        ProcessEnd::abort()
    }
}

impl std::fmt::Debug for ProcessEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProcessEnd")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the child process of [`the_default_ends_the_process_with_sigabrt`].
    const CHILD: &str = "TENURE_TEST_PROCESS_END_CHILD";

    #[test]
    fn the_default_ends_the_process_with_sigabrt() {
        let what = Unstoppable {
            lease: "test-shard-counter-3".into(),
            token: FencingToken::new(7),
            what: "entity key-7 of counter shard 3".into(),
        };
        if std::env::var_os(CHILD).is_some() {
            ProcessEnd::default().end(&what);
            // Reached only if the process went on: the parent sees exit status 0.
            return;
        }
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "unstoppable::tests::the_default_ends_the_process_with_sigabrt",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("run this test in a child process");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(6), "SIGABRT, not {status:?}");
    }

    #[test]
    fn a_hook_is_called_instead_and_the_setting_reads_its_two_values() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let end = ProcessEnd::with_hook({
            let seen = seen.clone();
            move |u| seen.lock().unwrap().push(u.to_string())
        });
        end.end(&Unstoppable {
            lease: "l".into(),
            token: FencingToken::new(3),
            what: "singleton s1".into(),
        });
        assert_eq!(*seen.lock().unwrap(), ["singleton s1 (lease l, token 3)"]);
        #[derive(Deserialize)]
        struct S {
            w: WhenKillFails,
        }
        let read = |v: &str| toml::from_str::<S>(&format!("w = {v:?}")).map(|s| s.w);
        assert_eq!(read("abort").unwrap(), WhenKillFails::Abort);
        assert_eq!(read("run-on-unsafe").unwrap(), WhenKillFails::RunOnUnsafe);
        let err = read("run-on").err().unwrap().to_string();
        assert!(err.contains("abort") && err.contains("run-on-unsafe"), "{err}");
    }
}
