//! Blocking store work (SQLite's statements) kept off the async scheduler's critical path,
//! with as few thread hops as the caller allows.
//!
//! A store whose client blocks (SQLite) must not wait on the scheduler: a wait for another
//! process's write lock would stall every task of the worker, and on a runtime with no
//! other worker, the timers too, among them the watchdog that ends a holder's belief at its
//! deadline. The blocking pool avoids that, at the price of two thread hops per call, which
//! on a machine with idle cores cost as much as the statement itself (the thin
//! lease path: a hop wakes a parked thread). So a blocking store may run a call **inline**,
//! on the calling thread, when both sides agree:
//! - the caller allows it: the lease machinery marks its own store calls with
//!   [`allow_inline`] (polled by the lease's driver: on the actor's task, or on the task
//!   of a `Lease` handle's caller, who waits for the call anyway), on a multi-threaded
//!   runtime with another worker to keep the timers and other tasks going;
//! - the store can do the work without waiting: its connection is free, and the work ends
//!   with an error instead of waiting for a lock (SQLite's busy timeout set to zero), in
//!   which case the store runs it again in the blocking pool.
//!
//! `block_in_place` was measured and rejected: it hands the worker's other tasks to a new
//! thread on every call, which costs more than the blocking pool's hops.

use std::future::Future;

tokio::task_local! {
    static INLINE: ();
}

/// True when blocking work that cannot wait (see the module docs) may run on the calling
/// thread: the caller was marked by [`allow_inline`]. False: use the blocking pool.
pub fn inline_allowed() -> bool {
    INLINE.try_with(|_| ()).is_ok()
}

/// Polls `fut` with [`inline_allowed`] true inside it, when the current runtime is
/// multi-threaded with at least two workers; else polls it as it is. Blocking inline then
/// holds up only the polling thread: a worker (the other keeps the timers going) or a
/// thread in `block_on` (not a worker at all).
pub(crate) async fn allow_inline<F: Future>(fut: F) -> F::Output {
    let spare_worker = tokio::runtime::Handle::try_current().is_ok_and(|h| {
        h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
            && h.metrics().num_workers() >= 2
    });
    if spare_worker {
        INLINE.scope((), fut).await
    } else {
        fut.await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn marked_futures_of_a_multi_threaded_runtime_may_block_inline() {
        let inside = tokio::spawn(allow_inline(async { inline_allowed() }));
        assert!(inside.await.unwrap());
        assert!(!tokio::spawn(async { inline_allowed() }).await.unwrap());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_runtime_with_one_worker_never_blocks_inline() {
        let inside = tokio::spawn(allow_inline(async { inline_allowed() }));
        assert!(!inside.await.unwrap());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_current_thread_runtime_never_blocks_inline() {
        assert!(!allow_inline(async { inline_allowed() }).await);
    }
}
