//! `tenure check`: the history checker of [`tenure::history::check`], and the check of
//! acknowledged increments against the example counter's SQLite file.

mod counter;

pub use counter::{CheckError, check_counter_acks};
pub use tenure::history::check::actions;
pub use tenure::history::check::{
    AckCheck, ActionRule, Hold, HoldEnd, Stats, Verdict, Violation, ViolationKind, check,
    check_acks, check_with, holds,
};
pub use tenure::history::{Entry, Event, HistoryError, read_history};
