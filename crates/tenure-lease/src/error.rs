//! Typed errors. A `LeaseError` from an operation means the outcome is *unknown*:
//! treat the lease as maybe held, never as certainly not held.

use std::sync::Arc;
use std::time::Duration;

/// The underlying error a [`StoreError`] wraps (a client library's, the operating
/// system's), shared so that store errors stay `Clone`.
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// What a store reports when an operation could not be carried out.
///
/// Its [`source`](std::error::Error::source) is the underlying error itself (a
/// `rusqlite::Error`, an `etcd_client::Error`, an `io::Error`…), so that it can be
/// downcast. (`Display` and `Error` are written out rather than derived for that reason:
/// a derived source would be the shared [`Cause`] wrapper.)
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached or refused to serve (down, locked, connection cut).
    Unavailable {
        /// The store kind (`sqlite`, `etcd`, …).
        store: &'static str,
        /// What failed, naming the operation and what it was on (key, file, server), with
        /// the cause's text.
        detail: String,
        /// The underlying error, when there is one.
        source: Option<Cause>,
    },
    /// The store answered with something the store crate could not interpret.
    Backend {
        /// The store kind (`sqlite`, `etcd`, …).
        store: &'static str,
        /// What failed, naming the operation and what it was on, with the cause's text.
        detail: String,
        /// The underlying error, when there is one.
        source: Option<Cause>,
    },
    /// The store lost state or its order went back (a lease file deleted or replaced, an
    /// etcd cluster restored without bumping its revisions, a token sequence rolled back by
    /// a fail-over): it refuses the operation, which did nothing, until it is safe again.
    /// `detail` names the cause.
    StateLost {
        /// The store kind (`sqlite`, `etcd`, …).
        store: &'static str,
        /// The cause, naming the file, revision or sequence.
        detail: String,
        /// The underlying error, when there is one.
        source: Option<Cause>,
    },
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Unavailable { store, detail, .. } => {
                write!(f, "{store} store unavailable: {detail}")
            }
            StoreError::Backend { store, detail, .. } => write!(f, "{store} store error: {detail}"),
            StoreError::StateLost { store, detail, .. } => {
                write!(f, "{store} store refuses: {detail}")
            }
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Unavailable { source, .. }
            | StoreError::Backend { source, .. }
            | StoreError::StateLost { source, .. } => source
                .as_deref()
                .map(|e| e as &(dyn std::error::Error + 'static)),
        }
    }
}

impl StoreError {
    /// [`StoreError::Unavailable`] of `store`; add the underlying error with
    /// [`caused_by`](StoreError::caused_by).
    pub fn unavailable(store: &'static str, detail: impl Into<String>) -> Self {
        StoreError::Unavailable {
            store,
            detail: detail.into(),
            source: None,
        }
    }

    /// [`StoreError::Backend`] of `store`; add the underlying error with
    /// [`caused_by`](StoreError::caused_by).
    pub fn backend(store: &'static str, detail: impl Into<String>) -> Self {
        StoreError::Backend {
            store,
            detail: detail.into(),
            source: None,
        }
    }

    /// [`StoreError::StateLost`] of `store`; add the underlying error with
    /// [`caused_by`](StoreError::caused_by).
    pub fn state_lost(store: &'static str, detail: impl Into<String>) -> Self {
        StoreError::StateLost {
            store,
            detail: detail.into(),
            source: None,
        }
    }

    /// This error with `cause` as its [source](std::error::Error::source), so that the
    /// whole chain stays inspectable.
    pub fn caused_by(self, cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        let cause: Cause = Arc::new(cause);
        match self {
            StoreError::Unavailable { store, detail, .. } => StoreError::Unavailable {
                store,
                detail,
                source: Some(cause),
            },
            StoreError::Backend { store, detail, .. } => StoreError::Backend {
                store,
                detail,
                source: Some(cause),
            },
            StoreError::StateLost { store, detail, .. } => StoreError::StateLost {
                store,
                detail,
                source: Some(cause),
            },
        }
    }
}

/// The outcome of a lease operation is unknown (or the lease could not be used at all),
/// except for the two preemption outcomes [`CleanupTimedOut`](LeaseError::CleanupTimedOut)
/// and [`Overtaken`](LeaseError::Overtaken), which are certain: not granted, and
/// [`NotHeld`](LeaseError::NotHeld), certain: nothing was done.
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
    /// Certain: this handle does not hold the lease, so it cannot act as its holder (an
    /// election's `proclaim` by a candidate that is not the leader).
    #[error("lease `{name}`: not held by this handle")]
    NotHeld {
        /// The lease name.
        name: String,
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
    /// A config file could not be read. The source is shared (`Arc`) so that the error
    /// stays `Clone`.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file's path.
        path: String,
        /// The I/O error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// Config text (a file, `origin`) is not TOML. The source is boxed: it is large, and
    /// every `Result` carrying a `ConfigError` would pay for it.
    #[error("malformed TOML in {origin}: {source}")]
    Parse {
        /// Where the text came from: a file's path, or what the caller named it.
        origin: String,
        /// The parser's error.
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A value that does not fit its key (wrong type, out of range, unknown key, …).
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
    /// A duration under `key` is longer than Tenure accepts.
    #[error("config key `{key}`: {source}")]
    Duration {
        /// The dotted config key.
        key: String,
        /// What was wrong with the duration.
        #[source]
        source: crate::duration::DurationError,
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
    /// A [`ConfigError::Duration`]: the duration under `key` was refused.
    pub fn duration(key: impl Into<String>, source: crate::duration::DurationError) -> Self {
        ConfigError::Duration {
            key: key.into(),
            source,
        }
    }

    /// A [`ConfigError::Invalid`]: `key` has a bad value, `detail` says why.
    pub fn invalid(key: impl Into<String>, detail: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            detail: detail.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_store_error_keeps_its_cause_as_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = StoreError::unavailable("etcd", "acquire /k: refused").caused_by(io);
        assert_eq!(e.to_string(), "etcd store unavailable: acquire /k: refused");
        let source = e.source().expect("the cause is the source");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("the cause keeps its type");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
        let lease = LeaseError::Store {
            name: "l".into(),
            operation: "acquire",
            source: e,
        };
        let mut chain = Vec::new();
        let mut next = lease.source();
        while let Some(e) = next {
            chain.push(e.to_string());
            next = e.source();
        }
        assert_eq!(
            chain,
            ["etcd store unavailable: acquire /k: refused", "refused"]
        );
    }

    #[test]
    fn a_store_error_without_cause_has_no_source() {
        assert!(
            StoreError::state_lost("sqlite", "file replaced")
                .source()
                .is_none()
        );
    }
}
