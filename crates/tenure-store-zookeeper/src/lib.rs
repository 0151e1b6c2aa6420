//! # tenure-store-zookeeper
//!
//! A lease store on Apache ZooKeeper (3.6 or later). Each held lease is an **ephemeral
//! node** `<lease node>/holder` owned by the **session of its owner**: one session per
//! owner per store, so the keep-alive cost does not grow with the number of leases, and a
//! crashed or cut-off holder's leases vanish with its session.
//!
//! **Layout.** A root this version creates (without `auth`) has the *families* layout: a
//! lease whose name contains `-member-` or `-shard-` belongs to the family its name has up
//! to the first of them (`tenure-member-` for the member lease `tenure-member-10.0.0.1:2552`),
//! and its lease node is `<root>/<family>/<name>`; other lease nodes are `<root>/<name>`.
//! Listing a prefix that has a family (the cluster's member leases) reads that family's
//! parent only, however many other leases the root holds (other prefixes read the root's
//! children and the parents of the families they cover). A root that already exists keeps
//! its layout: one an earlier version created is *flat* (every lease node `<root>/<name>`,
//! as before; the store logs this once), and so is one created with `auth`. The layout is
//! told by the root's ACL, which never changes: on a families root, `CREATE` on the root
//! and on every family parent belongs only to the identity `digest:tenure-layout-families-1`,
//! which this version's owner sessions add on such a root and earlier versions never had. An earlier
//! client there creates no node, so it is granted nothing (its acquires fail with
//! `NoAuth`) and never holds a lease at its flat path while this version grants it under its
//! family; a newer client on a flat root uses the flat paths, as the earlier ones do. No
//! root changes layout in place: moving to the families layout is a new root, with every
//! client stopped (docs/operations.md).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tenure_lease::{AcquireOutcome, AcquireRequest, LeaseStore};
//! use tenure_store_zookeeper::{ZooKeeperOptions, ZooKeeperStore};
//!
//! let ttl = Duration::from_secs(10);
//! let store = ZooKeeperStore::new(ZooKeeperOptions::new("127.0.0.1:2181", "/tenure/leases", ttl))?;
//! let req = AcquireRequest {
//!     name: "nightly-report".into(),
//!     owner: "10.0.0.1:2552".into(),
//!     instance: "1".into(),
//!     ttl,
//!     note: None,
//!     ..AcquireRequest::default()
//! };
//! if let AcquireOutcome::Granted(grant) = store.try_acquire(&req).await? {
//!     println!("fencing token {}", grant.token); // the holder node's czxid
//!     store.release(&req.name, &req.owner, grant.token).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! **Fencing tokens** are the holder node's creation zxid (`czxid`): ZooKeeper's own total
//! order, strictly increasing across holders, releases, expiries and server restarts. Not
//! the sequence number of a sequential node, which restarts when its parent is recreated.
//!
//! **Time.** The holder's local deadline is `send instant of its last successful acquire or
//! renewal + ttl - safety margin`. Two things can end a grant, and neither comes earlier
//! than `ttl` after the server processed that request:
//! - *The server ends the session* (the process died, or no request or ping reached the
//!   server) no earlier than the negotiated session timeout after the last request it saw.
//!   Every acquire and renewal is such a request, so this is ≥ processed + session timeout.
//!   The store refuses (with an error) any ttl above the negotiated session timeout, which
//!   the server bounds to [`minSessionTimeout`, `maxSessionTimeout`] (2 and 20 × tickTime by
//!   default): a shorter timeout than the ttl would let the server expire first.
//! - *This store expires it*: the client library pings on its own, so a live session alone
//!   would keep a grant forever. The store deletes a grant not renewed at `answer of the last
//!   acquire/renewal + ttl` (a version-checked multi, so a later grant is never touched):
//!   the answer comes after the processing, and on the same monotonic clock as the holder's
//!   deadline, after it.
//!
//! In an ensemble a follower reports a session's activity to the leader with its next
//! ping (within tickTime/2): the default margin (ttl/10) covers that whenever the session
//! timeout is at least 5 ticks. Renewal reads go after a `sync`, so a renewal never sees
//! a node the leader has already deleted.
//!
//! **Priority leases.** The holder node's data also keeps the grant's priority, cleanup
//! timeout and pending preemption request; a requester writes the request with a
//! version-checked `setData` (the czxid, so the token, stays), and the request goes with
//! the node. The same multi writes the root node's data, whose version so counts request
//! writes: a renewal reads that version in the same pipelined round trip as its `sync` and
//! `getEphemerals`, and reads holder nodes only for grants it has not read yet or when the
//! version moved (the `pending` module has the argument); so the common renewal,
//! with no request written since the last, costs one small read more than before, whatever
//! the number of leases. A grant with a forceful request is `Refused` and its local expiry
//! is not extended, so this store deletes the grant at most one ttl after its last
//! renewal (or the server does, with the session, when the holder is gone). Contenders are
//! granted it only once the node is gone, as for any expiry: a new czxid, a higher token.
//!
//! **Change checks** ([`GrantChanges`](tenure_lease::GrantChanges), for cluster
//! membership): a persistent recursive watch on the root, on the reader session, counts the
//! creations, deletions and data writes of holder nodes per prefix asked about; a check is
//! one `sync` and a read of the events that arrived before its answer. Grants ended by the
//! server with their holder's session are seen like any other (their holder node is
//! deleted); a disconnection, during which events can be lost, makes the next check answer
//! "changed". Every write under the root notifies each store that checks.
//!
//! **Sessions and lease events.** Connection lost (suspended): operations fail (`Err`),
//! the holder's deadline keeps running in the LeaseActor; when the library reconnects in
//! time, renewals succeed again. Session expired: its nodes are gone; the next renewal
//! reports each of its leases not held (`false`), and the owner's next acquire opens a new
//! session.

mod changes;
mod error;
pub mod fair;
mod fence;
mod node;
mod options;
mod pending;
mod session;
mod store;

pub use fence::ZooKeeperFence;
pub use options::{REFERENCE, ZooKeeperConfig, ZooKeeperOptions};
pub use store::{ZooKeeperStore, ZooKeeperStoreFactory};
/// The ZooKeeper client this store is built on.
pub use zookeeper_client;
