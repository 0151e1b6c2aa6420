//! Kits for Tenure's lease stores, kept out of the lease core: the store conformance kit
//! ([`conformance`], with [`conformance_tests!`]) every store crate runs against itself, and
//! the helpers Tenure's benchmarks share ([`bench`], and [`report`]: benches writing their
//! section of `docs/benchmarks.md`), and one store wrapping another for
//! test doubles ([`wrap`]).

pub mod bench;
pub mod conformance;
pub mod report;
pub mod wrap;
