//! The management HTTP endpoint of a Tenure node (Akka Management's role): the members as
//! this node sees them, the leases it holds with their state, liveness and readiness
//! checks, and Prometheus metrics.
//!
//! | route | answer |
//! |---|---|
//! | `GET /` | a live page of the members, the shard map and this node's leases (static HTML polling the routes below) |
//! | `GET /health/alive` | 200 while the process serves |
//! | `GET /health/ready` | 200 when the node serves ([`tenure_cluster::Readiness`]): an up member, not leaving, every sharding region registered with its coordinator and knowing the shard homes, none of its leases suspended for `ready-suspended-after`; else 503 with the reason |
//! | `GET /cluster/members` | the node's view (JSON): members, status, age, reachability, and `down`: members that went down (not a leave) since the endpoint started |
//! | `GET /cluster/shards` | the shard map of every entity type served here ([`Management::add_region`]): JSON list of [`tenure_sharding::ShardMap`] (each shard's home; entities and lease token of the shards this node hosts; shards per node) |
//! | `GET /cluster/shards/{type}` | one type's [`ShardMap`](tenure_sharding::ShardMap); 404 naming the known types |
//! | `GET /leases` | the leases of this node (JSON [`LeaseRow`]s): name, owner, token, state, since when |
//! | `POST /cluster/members/{host:port}/leave` | that member leaves gracefully (this node, or another member the request is passed on to); needs `Authorization: Bearer <cluster.management.token>` |
//! | `POST /cluster/members/{host:port}/down` | that member is downed (Akka's `Cluster.down`); same token |
//! | `GET /metrics` | every `metrics` value of the process, in Prometheus' text format |
//!
//! Every request must name, in `Host`, an IP address, `localhost`, the node's cluster host
//! or one of `allowed-hosts` (else 421: a page reaching a loopback endpoint through DNS
//! rebinding names its own host), and carry no body (else 413). At most `max-connections`
//! connections are served at once, each closed after `idle-timeout` without a complete
//! request head, heads limited to `max-header-bytes` (else 431).
//!
//! Other paths answer 404 naming the path; the operator routes' answers are listed in
//! their module (401/403 without the right token, 403 when no token is configured, 400 for
//! a malformed address, 404 for a non-member, 409 when it cannot be done now). Start it with [`Management::start`].

mod leases;
mod operator;
mod serve;
mod server;
mod settings;

pub use leases::{LeaseRow, LeaseTable, RowState};
pub use server::{Management, ManagementError, install_metrics};
pub use settings::{ManagementConfig, ManagementSettings, OperatorToken, REFERENCE};
