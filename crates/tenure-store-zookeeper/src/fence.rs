//! Writes guarded by the lease in the caller's own ZooKeeper `multi`: two `check` ops that
//! hold only while the grant with the caller's fencing token is the lease's current one.
//!
//! ```no_run
//! # async fn f(store: &tenure_store_zookeeper::ZooKeeperStore, client: &zookeeper_client::Client, token: tenure_lease::FencingToken) -> Result<(), Box<dyn std::error::Error>> {
//! let Some(fence) = store.fence("nightly-report", token).await? else {
//!     return Ok(()); // not held with this token any more: write nothing
//! };
//! let mut multi = client.new_multi_writer();
//! fence.add_to(&mut multi)?;
//! multi.add_set_data("/reports/nightly", b"done", None)?;
//! multi.commit().await?; // fails whole, writing nothing, once the grant was replaced
//! # Ok(()) }
//! ```

use zookeeper_client as zk;

/// The checks of one grant (from [`ZooKeeperStore::fence`](crate::ZooKeeperStore::fence)):
/// the lease node's data version, which every grant bumps in the multi that creates its
/// holder node, and the holder node's existence, which ends with a release or the holder's
/// session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZooKeeperFence {
    pub(crate) lease: String,
    pub(crate) version: i32,
    pub(crate) holder: String,
}

impl ZooKeeperFence {
    /// Adds the two checks to `multi`: it then commits only if no grant of the lease was
    /// made since the fenced one and the fenced one was neither released nor expired.
    /// `Err` only when a path is not valid for the client (e.g. outside its chroot).
    pub fn add_to(&self, multi: &mut zk::MultiWriter<'_>) -> Result<(), zk::Error> {
        multi.add_check_version(&self.lease, self.version)?;
        // -1: any version; the check fails only when the node is gone.
        multi.add_check_version(&self.holder, -1)
    }
}
