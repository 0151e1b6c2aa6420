//! Mapping ZooKeeper client errors onto the store SPI's errors (all mean: outcome unknown).

use tenure_lease::StoreError;
use zookeeper_client as zk;

pub(crate) const KIND: &str = "zookeeper";

pub(crate) fn backend(detail: impl Into<String>) -> StoreError {
    StoreError::Backend {
        store: KIND,
        detail: detail.into(),
    }
}

/// `what` names the operation and path.
pub(crate) fn from_zk(what: &str, e: &zk::Error) -> StoreError {
    use zk::Error::*;
    match e {
        ConnectionLoss | Timeout | SessionExpired | SessionMoved | ClientClosed | NoHosts
        | Throttled | NotReadOnly => StoreError::Unavailable {
            store: KIND,
            detail: format!("{what}: {e}"),
        },
        _ => backend(format!("{what}: {e}")),
    }
}

/// Whether `e` says the session is over (its ephemeral nodes are gone or will be).
pub(crate) fn session_over(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::AuthFailed
    )
}
