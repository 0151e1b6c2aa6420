//! The library half of the `tenure` command: what its subcommands share with tests and
//! tools: the history checker, availability read from a history, the multi-process
//! cluster harness and `tenure demo`.

pub mod availability;
pub mod check;
pub mod demo;
pub mod harness;
