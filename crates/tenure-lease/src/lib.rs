//! # tenure-lease
//!
//! Distributed leases with Akka Coordination's contract, tightened: every grant carries a
//! fencing token, and the holder gives its lease up (on a clock that counts host suspend,
//! with a safety margin) before any other owner can be granted it.
//!
//! ```
//! use std::time::Duration;
//! use tenure_lease::{Acquired, Lease, LeaseSettings, LeaseSpec, MemoryStore};
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = std::sync::Arc::new(MemoryStore::new());
//! let mut settings = LeaseSettings::with_timeout(Duration::from_secs(10));
//! settings.heartbeat_interval = Duration::from_secs(1);
//! let lease = Lease::start(LeaseSpec::new("tenure-singleton-billing", "10.0.0.1:2552", store, settings)?).await?;
//! match lease.acquire_with_lost(|lost| eprintln!("lost {}: {}", lost.name, lost.reason)).await? {
//!     Acquired::Granted { token } => {
//!         assert!(lease.check_lease());
//!         // ... work, presenting `token` to every guarded resource ...
//!         assert!(lease.release().await?);
//!     }
//!     Acquired::NotGranted { holder, .. } => println!("held by {holder:?}"),
//! }
//! # Ok(()) }
//! ```
//!
//! Layers: the [store SPI](store) (small compare-and-set operations, one crate per store),
//! the [`LeaseActor`] (all timing: acquisition retries, heartbeats, the local deadline,
//! `LeaseGranted`/`LeaseLost`), the [`Lease`] handle for plain async code, and the
//! [`LeaseProvider`] that loads leases by (name, config section, owner). Recipes built on
//! the same LeaseActor, on every store: [leader election](election) and a counting
//! [semaphore](semaphore).
//!
//! Inside the LeaseActor, every decision is made by a pure, synchronous state machine
//! (crate-private `machine` module): it takes messages, store answers and the holder clock's
//! reading as inputs and returns effects (store calls, timers, replies, events), reading no
//! clock and awaiting nothing. The actor only drives it, and one emitter turns its events
//! into every output: the [`LeaseEventSink`], lost-callbacks, [history] events,
//! [`LeaseObserver`] traces, metrics and log lines.

mod actor;
mod alarms;
pub mod blocking;
pub mod clock;
pub mod config;
mod driver;
pub mod duration;
pub mod election;
mod error;
mod events;
pub mod fence;
mod grant;
mod handle;
pub mod history;
mod machine;
pub mod memory;
pub mod metrics;
pub mod names;
mod priority;
mod provider;
mod published;
mod renewal;
pub mod semaphore;
mod settings;
mod stop_budget;
pub mod store;
mod token;
pub mod trace;
mod unstoppable;
pub mod validity;

#[cfg(test)]
mod fair_tests;
#[cfg(test)]
mod machine_tests;
#[cfg(test)]
mod preemption_tests;
#[cfg(test)]
mod state_tests;
#[cfg(test)]
mod suspend_tests;
#[cfg(test)]
mod timing_tests;

pub use actor::{
    AcquireReply, Acquired, LeaseActor, LeaseActorState, LeaseMsg, LeaseSpec, LeaseView,
};
pub use clock::{HolderClock, SuspendControl};
pub use config::{CONFIG_VAR, LeaseSection, TenureConfig, TenureSettings};
pub use election::{Election, Leader, LeaderWatch};
pub use error::{Cause, ConfigError, LeaseError, StoreError};
pub use events::{
    LeaseEvent, LeaseEventSink, LeaseGranted, LeaseLost, LeaseResumed, LeaseState, LeaseSuspended,
    PreemptionRequested, PreemptionWithdrawn,
};
pub use fence::{FenceCheck, FenceError, StaleToken};
pub use grant::Grant;
pub use handle::Lease;
pub use machine::ReleaseScope;
pub use memory::{Fault, MemoryStore, MemoryStoreFactory};
pub use priority::AcquireOptions;
pub use provider::{LeaseProvider, StoreFactory, StoreRegistry};
pub use renewal::RenewalBatcher;
pub use semaphore::{Permit, Semaphore};
pub use settings::{LeaseSettings, LeaseTiming};
pub use stop_budget::{StopBudget, StopDeadlines};
pub use store::{
    AcquireOutcome, AcquireRequest, AcquireStep, Capabilities, ChangeVersion, Changes,
    EMERGENCY_PRIORITY, FairQueue, GrantChanges, HeldLease, HolderWatch, LeaseRecord, LeaseStore,
    PreemptAnswer, PreemptionRequest, PreemptionRequests, RememberChange, RememberedIds, Renewal,
    WatchEvent, WatchReceiver,
};
pub use token::FencingToken;
pub use trace::{LeaseObserver, LeaseTrace};
pub use unstoppable::{LossWatch, ProcessEnd, Terminator, Unstoppable, WhenKillFails};
pub use validity::LostReason;
