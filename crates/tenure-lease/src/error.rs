//! Typed errors. A `LeaseError` from an operation means the outcome is *unknown*:
//! treat the lease as maybe held, never as certainly not held.

use std::sync::Arc;
use std::time::Duration;

/// What a store reports when an operation could not be carried out.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached or refused to serve (down, locked, connection cut).
    #[error("{store} store unavailable: {detail}")]
    Unavailable { store: &'static str, detail: String },
    /// The store answered with something the store crate could not interpret.
    #[error("{store} store error: {detail}")]
    Backend { store: &'static str, detail: String },
    /// The store lost state or its order went back (a lease file deleted or replaced, an
    /// etcd cluster restored without bumping its revisions, a token sequence rolled back by
    /// a fail-over): it refuses the operation, which did nothing, until it is safe again.
    /// `detail` names the cause.
    #[error("{store} store refuses: {detail}")]
    StateLost { store: &'static str, detail: String },
    /// The store does not have the capability the operation needs (see
    /// [`Capabilities`](crate::Capabilities)); nothing was done.
    #[error("{store} store does not support {operation}")]
    Unsupported {
        store: &'static str,
        operation: &'static str,
    },
}

/// The outcome of a lease operation is unknown (or the lease could not be used at all),
/// except for the two preemption outcomes [`CleanupTimedOut`](LeaseError::CleanupTimedOut)
/// and [`Overtaken`](LeaseError::Overtaken), which are certain: not granted.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The store did not answer within `lease-operation-timeout`.
    #[error("lease `{name}`: {operation} timed out after {timeout:?}; the outcome is unknown")]
    Timeout {
        name: String,
        operation: &'static str,
        timeout: Duration,
    },
    /// The store failed the operation; it may or may not have taken effect.
    #[error("lease `{name}`: {operation} failed; the outcome is unknown: {source}")]
    Store {
        name: String,
        operation: &'static str,
        #[source]
        source: StoreError,
    },
    /// The wait for a grant was cancelled by a release or stop.
    #[error("lease `{name}`: acquire cancelled by release")]
    Cancelled { name: String },
    /// A non-forceful preemption ended: the lower-priority holder did not release within
    /// min(waiting timeout, its cleanup timeout). The request was withdrawn; nothing changed.
    #[error(
        "lease `{name}`: holder {holder} did not finish cleanup in time (waited {waited:?}, its cleanup timeout is {cleanup_timeout:?}); the request was withdrawn"
    )]
    CleanupTimedOut {
        name: String,
        holder: String,
        cleanup_timeout: Duration,
        waited: Duration,
    },
    /// While this requester waited for a lower-priority holder, an owner with an even higher
    /// priority requested the lease: it goes first, this request is dropped.
    #[error("lease `{name}`: overtaken by {by} (priority {priority}) while waiting for the holder")]
    Overtaken {
        name: String,
        by: String,
        priority: u64,
    },
    /// The lease actor behind this handle has stopped.
    #[error("lease `{name}`: its lease actor is not running")]
    ActorStopped { name: String },
    /// The lease could not be set up from configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Bad configuration or input, found at load time. Every variant names what was wrong.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A config file could not be read. The source is shared (`Arc`) so that the error
    /// stays `Clone`.
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// Config text (a file, `origin`) is not TOML. The source is boxed: it is large, and
    /// every `Result` carrying a `ConfigError` would pay for it.
    #[error("malformed TOML in {origin}: {source}")]
    Parse {
        origin: String,
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A value that does not fit its key (wrong type, out of range, unknown key, …).
    #[error("config key `{key}`: {detail}")]
    Invalid { key: String, detail: String },
    /// Two settings that are each valid but do not fit together.
    #[error("config keys `{key}` and `{other}` do not fit together: {detail}")]
    Conflict {
        key: String,
        other: String,
        detail: String,
    },
    #[error("config key `{key}`: unknown store kind `{kind}` (known: {known})")]
    UnknownStore {
        key: String,
        kind: String,
        known: String,
    },
    /// A store kind Tenure knows but this build left out: `feature` turns it on.
    #[error(
        "config key `{key}`: store kind `{kind}` is not in this build; enable the cargo feature `{feature}` (of `tenure`, or of `tenure-cli` for the `tenure` command)"
    )]
    StoreNotBuilt {
        key: String,
        kind: String,
        feature: String,
    },
    #[error("no lease section `{section}` in config (known: {known})")]
    UnknownSection { section: String, known: String },
    #[error("invalid lease name `{name}`: {detail}")]
    LeaseName { name: String, detail: String },
    #[error("lease store at {path}: {detail}")]
    StorePath { path: String, detail: String },
}

impl ConfigError {
    pub fn invalid(key: impl Into<String>, detail: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            detail: detail.into(),
        }
    }
}
