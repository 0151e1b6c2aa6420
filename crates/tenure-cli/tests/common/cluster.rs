//! The multi-process cluster harness (`tenure_cli::harness`) with this build's `tenure`
//! binary: `Cluster::start(n)`, `Cluster::start_with(n, &options)` and friends.

#![allow(dead_code)]

pub use tenure_cli::harness::*;

pub const TENURE: &str = env!("CARGO_BIN_EXE_tenure");

/// Constructors of harness clusters running this build's `tenure` binary.
pub trait TestCluster {
    /// Writes configs for `n` nodes (seed: node 0) without starting them.
    fn new(n: usize) -> Self;
    fn with_options(n: usize, options: &Options) -> Self;
    /// Starts `n` nodes and waits until every node sees all of them up.
    fn start(n: usize) -> Self;
    /// Starts `n` nodes with `options` and waits until they converge.
    fn start_with(n: usize, options: &Options) -> Self;
}

impl TestCluster for Cluster {
    fn new(n: usize) -> Cluster {
        Cluster::configure(TENURE.as_ref(), n, &Options::default())
    }

    fn with_options(n: usize, options: &Options) -> Cluster {
        Cluster::configure(TENURE.as_ref(), n, options)
    }

    fn start(n: usize) -> Cluster {
        Cluster::launch(TENURE.as_ref(), n, &Options::default())
    }

    fn start_with(n: usize, options: &Options) -> Cluster {
        Cluster::launch(TENURE.as_ref(), n, options)
    }
}
