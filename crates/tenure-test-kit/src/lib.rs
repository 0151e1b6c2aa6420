//! Real servers for Tenure's tests and benchmarks, each on free loopback ports with its data
//! in a temporary directory, stopped when dropped: PostgreSQL ([`postgres`]), etcd
//! ([`etcd`]) and ZooKeeper ([`zookeeper`]), from their Debian packages (`.ci/test.sh`
//! installs them). A missing server is a loud failure naming the package, never a skip.

pub mod etcd;
pub mod postgres;
pub mod signal;
pub mod zookeeper;
