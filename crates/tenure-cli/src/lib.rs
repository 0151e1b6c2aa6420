//! The library half of the `tenure` command: what its subcommands share with tests and
//! tools, such as the history checker.

pub mod check;
