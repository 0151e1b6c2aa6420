//! A gate that blocks threads until the test opens it: to make code hang outside an
//! await (a thread blocked in a system call, a busy loop), as code that outlives its kill.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Blocks the threads that call [`Gate::block`] until [`Gate::open`].
#[derive(Default)]
pub struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
    blocked: AtomicBool,
}

impl Gate {
    /// Blocks the calling thread until the gate opens (at once if it is open).
    pub fn block(&self) {
        self.blocked.store(true, Ordering::SeqCst);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        while !*open {
            open = self.opened.wait(open).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Opens the gate: every blocked thread goes on, and later callers do not block.
    pub fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.opened.notify_all();
    }

    /// Waits until a thread blocked at the gate; panics when none did within 10 s.
    /// Polled: a blocked thread must not wake a task of the runtime on its way in (the
    /// task would wait on the blocked thread).
    pub async fn wait_blocked(&self) {
        crate::eventually_async(
            "a thread blocked at the gate",
            Duration::from_secs(10),
            async || {
                self.blocked
                    .load(Ordering::SeqCst)
                    .then_some(())
                    .ok_or("none yet")
            },
        )
        .await
    }
}
