//! The library half of the `tenure` command: what its subcommands share with tests and
//! tools: the history checker, availability read from a history, and `tenure demo` (its
//! multi-process local cluster, its example singleton and sharded counter).

pub mod availability;
pub mod check;
pub mod demo;
pub mod history;
