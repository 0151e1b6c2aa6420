//! The history checker, the one `tenure check`, the conformance kit and the tests use.
//!
//! Per lease: no two owners (node and incarnation) believed to hold it at overlapping
//! times, where a hold whose end the history does not show counts as held until its last
//! `valid_until`; tokens strictly increasing across grants in grant order; every grant
//! after the previous grant's hold ended (released, lost, expired or its process killed),
//! also for a new grant of the same owner. Per guarded resource: no write accepted with a
//! token lower than one already accepted, in the resource's own order. Per action (an
//! entity alive, a singleton instance alive, a fenced write accepted): inside its node's hold
//! of the matching lease, a process frozen across its deadline excepted for a grace after it
//! resumes ([`actions`]). Given the resource's final state ([`check_acks`]): every
//! acknowledged increment accepted and still there. Given durable entities' journals
//! ([`check_journal`]): every acknowledged command's events there exactly once, none
//! appended under a stale grant, sequences contiguous, recoveries matching the events.

mod acks;
pub mod actions;
mod holds;
mod journal;
mod verdict;

pub use acks::{AckCheck, check_acks};
pub use actions::ActionRule;
pub use holds::{Hold, HoldEnd, holds};
pub use journal::{JournalCheck, JournalEvent, Replay, check_journal, state_digest};
pub use verdict::{Stats, Verdict, Violation, ViolationKind, check, check_with};
