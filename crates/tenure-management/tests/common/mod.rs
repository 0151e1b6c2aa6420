//! What the management endpoint's tests share.

use tenure_cluster::Node;
use tenure_lease::LeaseProvider;
use tenure_management::{LeaseTable, Management, ManagementSettings};

/// Starts the management endpoint of `node` with the `[cluster.management]` settings of
/// `provider`'s config, its lease page showing `leases`. Panics when the settings are
/// refused or the endpoint cannot start (a test tool).
pub async fn start_management(
    node: &Node,
    provider: &LeaseProvider,
    leases: LeaseTable,
) -> Management {
    let settings = ManagementSettings::from_config(provider.config())
        .unwrap_or_else(|e| panic!("the test's management settings: {e}"));
    Management::start(node, leases, settings)
        .await
        .unwrap_or_else(|e| panic!("the test's management endpoint did not start: {e}"))
}
