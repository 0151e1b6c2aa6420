//! The library of the `tenure` command: the multi-process cluster harness and `tenure demo`.

pub mod demo;
pub mod harness;
