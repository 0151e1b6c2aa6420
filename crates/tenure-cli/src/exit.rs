//! Exit codes and the CLI's error type.

use std::process::ExitCode;

/// How a command ended; each maps to an exit code scripts can test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 0: granted / released / held.
    Success,
    /// 1: not granted (held by another owner), not released (not ours), free.
    No,
    /// 2: error: the outcome is unknown, or bad input.
    Error,
    /// 3: the lease was lost while held.
    Lost,
    /// The guarded command's own exit status.
    Child(u8),
}

impl Outcome {
    pub fn exit_code(self) -> ExitCode {
        ExitCode::from(match self {
            Outcome::Success => 0,
            Outcome::No => 1,
            Outcome::Error => 2,
            Outcome::Lost => 3,
            Outcome::Child(code) => code,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Config(#[from] tenure::ConfigError),
    #[error(transparent)]
    Lease(#[from] tenure::LeaseError),
    #[error(transparent)]
    Cluster(#[from] tenure::cluster::ClusterError),
    #[error(transparent)]
    History(#[from] tenure::history::HistoryError),
    #[error("{0}")]
    Command(String),
}
