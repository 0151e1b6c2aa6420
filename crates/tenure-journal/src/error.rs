//! What a journal reports when an operation could not be carried out.

use tenure_lease::StoreError;

/// Why a journal operation failed.
///
/// For a write (an append or a snapshot), [`JournalError::Invalid`] means nothing was
/// written; [`JournalError::Store`] means the outcome is **unknown**: the write may have
/// been committed (treat it as *maybe written*, never as *certainly not*; reading the
/// journal again tells).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// The request is not valid (an empty persistence id, no events, sequence number 0…);
    /// nothing was written.
    #[error("journal: invalid request for `{persistence_id}`: {detail}")]
    Invalid {
        /// The persistence id the request named.
        persistence_id: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The journal's database failed or did not answer.
    #[error("journal: {operation} of `{persistence_id}` failed: {source}")]
    Store {
        /// The persistence id the operation was on (empty for operations on the journal).
        persistence_id: String,
        /// The operation: `append`, `read`, `save snapshot`, `load snapshot`, `list`.
        operation: &'static str,
        /// The database's error, with the client library's error as its source.
        #[source]
        source: StoreError,
    },
}

impl JournalError {
    /// [`JournalError::Invalid`] for `persistence_id`.
    pub fn invalid(persistence_id: &str, detail: impl Into<String>) -> Self {
        JournalError::Invalid {
            persistence_id: persistence_id.to_string(),
            detail: detail.into(),
        }
    }

    /// [`JournalError::Store`]: `operation` of `persistence_id` failed with `source`.
    pub fn store(persistence_id: &str, operation: &'static str, source: StoreError) -> Self {
        JournalError::Store {
            persistence_id: persistence_id.to_string(),
            operation,
            source,
        }
    }
}
