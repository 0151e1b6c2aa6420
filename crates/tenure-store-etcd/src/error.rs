//! etcd client errors as store errors (outcome unknown).

use tenure_lease::StoreError;

/// `operation` on `what` (a key, a session) failed. Transport failures, gRPC statuses
/// (unavailable, deadline exceeded, no leader…) and broken streams are
/// [`StoreError::Unavailable`]; malformed requests or answers are [`StoreError::Backend`].
pub(crate) fn etcd_error(operation: &str, what: &str, e: etcd_client::Error) -> StoreError {
    use etcd_client::Error as E;
    let detail = format!("{operation} {what}: {e}");
    let error = match &e {
        E::InvalidArgs(_) | E::InvalidUri(_) | E::Utf8Error(_) | E::InvalidMetadataValue(_) => {
            StoreError::backend("etcd", detail)
        }
        _ => StoreError::unavailable("etcd", detail),
    };
    error.caused_by(e)
}
