//! Mapping ZooKeeper client errors onto the store SPI's errors (all mean: outcome unknown).

use tenure_lease::StoreError;
use zookeeper_client as zk;

pub(crate) const KIND: &str = "zookeeper";

pub(crate) fn backend(detail: impl Into<String>) -> StoreError {
    StoreError::backend(KIND, detail.into())
}

/// `what` names the operation and path. Answers about the request itself (bad path,
/// version, ACL, unreadable reply) are backend errors; everything else (connection lost,
/// timeouts, session trouble, throttling) means the store could not be reached.
pub(crate) fn from_zk(what: &str, e: &zk::Error) -> StoreError {
    use zk::Error::*;
    let error = match e {
        NoNode
        | NodeExists
        | BadVersion
        | NotEmpty
        | NoChildrenForEphemerals
        | NoAuth
        | InvalidAcl
        | BadArguments(_)
        | Unimplemented
        | MarshallingError
        | UnmarshalError { .. }
        | QuotaExceeded
        | ReconfigDisabled
        | RuntimeInconsistent => backend(format!("{what}: {e}")),
        _ => StoreError::unavailable(KIND, format!("{what}: {e}")),
    };
    error.caused_by(e.clone())
}

/// Whether `e` says the session is over (its ephemeral nodes are gone or will be).
pub(crate) fn session_over(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::AuthFailed
    )
}
