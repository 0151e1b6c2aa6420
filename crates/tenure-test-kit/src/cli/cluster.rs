//! The multi-process cluster harness (`tenure_cli::demo::cluster`) with this build's
//! `tenure` binary: `Cluster::start(n)`, `Cluster::start_with(n, &options)` and friends.

pub use tenure_cli::demo::cluster::*;

pub use super::TENURE;

/// Constructors of harness clusters running this build's `tenure` binary.
pub trait TestCluster {
    /// Writes configs for `n` nodes (seed: node 0) without starting them.
    fn new(n: usize) -> Self;
    /// Writes configs for `n` nodes with `options` without starting them.
    fn with_options(n: usize, options: &Options) -> Self;
    /// Starts `n` nodes and waits until every node sees all of them up.
    fn start(n: usize) -> Self;
    /// Starts `n` nodes with `options` and waits until they converge.
    fn start_with(n: usize, options: &Options) -> Self;
}

impl TestCluster for Cluster {
    fn new(n: usize) -> Cluster {
        Cluster::configure(&TENURE, n, &Options::default())
    }

    fn with_options(n: usize, options: &Options) -> Cluster {
        Cluster::configure(&TENURE, n, options)
    }

    fn start(n: usize) -> Cluster {
        Cluster::launch(&TENURE, n, &Options::default())
    }

    fn start_with(n: usize, options: &Options) -> Cluster {
        Cluster::launch(&TENURE, n, options)
    }
}
