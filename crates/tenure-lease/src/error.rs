//! Typed errors. A `LeaseError` from an operation means the outcome is *unknown*:
//! treat the lease as maybe held, never as certainly not held.

use std::time::Duration;

/// What a store reports when an operation could not be carried out.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached or refused to serve (down, locked, connection cut).
    #[error("{store} store unavailable: {detail}")]
    Unavailable {
        /// The store kind, e.g. `etcd`.
        store: &'static str,
        /// What went wrong, as the store or its client said.
        detail: String,
    },
    /// The store answered with something the store crate could not interpret.
    #[error("{store} store error: {detail}")]
    Backend {
        /// The store kind, e.g. `etcd`.
        store: &'static str,
        /// What could not be interpreted.
        detail: String,
    },
    /// The store lost state or its order went back (a lease file deleted or replaced, an
    /// etcd cluster restored without bumping its revisions, a token sequence rolled back by
    /// a fail-over): it refuses the operation, which did nothing, until it is safe again.
    /// `detail` names the cause.
    #[error("{store} store refuses: {detail}")]
    StateLost {
        /// The store kind, e.g. `sqlite`.
        store: &'static str,
        /// The cause.
        detail: String,
    },
    /// The store does not have the capability the operation needs (see
    /// [`Capabilities`](crate::Capabilities)); nothing was done.
    #[error("{store} store does not support {operation}")]
    Unsupported {
        /// The store kind, e.g. `sqlite`.
        store: &'static str,
        /// The operation it cannot do, e.g. `fair acquire`.
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
        /// The lease name.
        name: String,
        /// The operation: `acquire`, `renew` or `release`.
        operation: &'static str,
        /// How long it waited (`lease-operation-timeout`).
        timeout: Duration,
    },
    /// The store failed the operation; it may or may not have taken effect.
    #[error("lease `{name}`: {operation} failed; the outcome is unknown: {source}")]
    Store {
        /// The lease name.
        name: String,
        /// The operation: `acquire`, `renew` or `release`.
        operation: &'static str,
        /// What the store reported.
        #[source]
        source: StoreError,
    },
    /// The wait for a grant was cancelled by a release or stop.
    #[error("lease `{name}`: acquire cancelled by release")]
    Cancelled {
        /// The lease name.
        name: String,
    },
    /// A non-forceful preemption ended: the lower-priority holder did not release within
    /// min(waiting timeout, its cleanup timeout). The request was withdrawn; nothing changed.
    #[error(
        "lease `{name}`: holder {holder} did not finish cleanup in time (waited {waited:?}, its cleanup timeout is {cleanup_timeout:?}); the request was withdrawn"
    )]
    CleanupTimedOut {
        /// The lease name.
        name: String,
        /// The owner holding the lease, which did not release it.
        holder: String,
        /// The holder's cleanup timeout.
        cleanup_timeout: Duration,
        /// How long this requester waited before withdrawing.
        waited: Duration,
    },
    /// While this requester waited for a lower-priority holder, an owner with an even higher
    /// priority requested the lease: it goes first, this request is dropped.
    #[error("lease `{name}`: overtaken by {by} (priority {priority}) while waiting for the holder")]
    Overtaken {
        /// The lease name.
        name: String,
        /// The owner that overtook this request.
        by: String,
        /// Its priority (higher goes first).
        priority: u64,
    },
    /// The lease actor behind this handle has stopped.
    #[error("lease `{name}`: its lease actor is not running")]
    ActorStopped {
        /// The lease name.
        name: String,
    },
    /// The lease could not be set up from configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Bad configuration or input, found at load time. Every variant names what was wrong.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {detail}")]
    Read {
        /// The file's path.
        path: String,
        /// The I/O error.
        detail: String,
    },
    /// The text is not valid TOML.
    #[error("malformed TOML in {origin}: {detail}")]
    Parse {
        /// Where the text came from: a file's path, or what the caller named it.
        origin: String,
        /// The parser's error.
        detail: String,
    },
    /// A key has a value it cannot have.
    #[error("config key `{key}`: {detail}")]
    Invalid {
        /// The dotted config key, e.g. `lease.default.ttl`.
        key: String,
        /// What is wrong with the value.
        detail: String,
    },
    /// Two settings that are each valid but do not fit together.
    #[error("config keys `{key}` and `{other}` do not fit together: {detail}")]
    Conflict {
        /// One key, dotted.
        key: String,
        /// The key it does not fit with.
        other: String,
        /// Why they do not fit.
        detail: String,
    },
    /// The `store` key names a store kind Tenure does not know.
    #[error("config key `{key}`: unknown store kind `{kind}` (known: {known})")]
    UnknownStore {
        /// The dotted config key.
        key: String,
        /// The kind given.
        kind: String,
        /// The kinds Tenure knows, comma-separated.
        known: String,
    },
    /// A store kind Tenure knows but this build left out: `feature` turns it on.
    #[error(
        "config key `{key}`: store kind `{kind}` is not in this build; enable the cargo feature `{feature}` (of `tenure`, or of `tenure-cli` for the `tenure` command)"
    )]
    StoreNotBuilt {
        /// The dotted config key.
        key: String,
        /// The kind given.
        kind: String,
        /// The cargo feature that builds the store in.
        feature: String,
    },
    /// No `[lease.<section>]` of that name.
    #[error("no lease section `{section}` in config (known: {known})")]
    UnknownSection {
        /// The section asked for.
        section: String,
        /// The sections the config has, comma-separated.
        known: String,
    },
    /// A lease name Tenure refuses: empty, or with control characters.
    #[error("invalid lease name `{name}`: {detail}")]
    LeaseName {
        /// The name given.
        name: String,
        /// Why it is refused.
        detail: String,
    },
    /// The store's file or directory could not be opened or set up.
    #[error("lease store at {path}: {detail}")]
    StorePath {
        /// The path.
        path: String,
        /// The error.
        detail: String,
    },
}

impl ConfigError {
    /// A [`ConfigError::Invalid`]: `key` has a bad value, `detail` says why.
    pub fn invalid(key: impl Into<String>, detail: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            detail: detail.into(),
        }
    }
}
