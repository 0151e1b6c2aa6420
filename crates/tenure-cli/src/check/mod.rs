//! `tenure check`: the history checker of [`tenure::history::check`], and the check of
//! acknowledged increments against the example counter's SQLite file, and of durable
//! entities' journals.

mod counter;
mod journal;

pub use counter::{CheckError, check_counter_acks};
pub use journal::{JournalReadError, OpenError, check_counter_journal, read_journal};
pub use tenure::history::check::actions;
pub use tenure::history::check::{
    AckCheck, ActionRule, Hold, HoldEnd, Stats, Verdict, Violation, ViolationKind, check,
    check_acks, check_with, holds,
};
pub use tenure::history::check::{JournalCheck, JournalEvent, check_journal};
pub use tenure::history::{Entry, Event, HistoryError, read_history};
