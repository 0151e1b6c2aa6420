//! The management HTTP endpoint of a Tenure node (Akka Management's role): the members as
//! this node sees them, the leases it holds with their state, liveness and readiness
//! checks, and Prometheus metrics.
//!
//! | route | answer |
//! |---|---|
//! | `GET /` | a live page of the members and this node's leases (static HTML polling the routes below) |
//! | `GET /health/alive` | 200 while the process serves |
//! | `GET /health/ready` | 200 when the node is an up member and none of its leases has been suspended for `ready-suspended-after`; else 503 with the reason |
//! | `GET /cluster/members` | the node's view (JSON): members, status, age, reachability, and `down`: members that went down (not a leave) since the endpoint started |
//! | `GET /leases` | the leases of this node (JSON): name, owner, token, state, since when |
//! | `GET /metrics` | every `metrics` value of the process, in Prometheus' text format |
//!
//! Other paths answer 404 naming the path. Start it with [`Management::start`].

mod leases;
mod server;
mod settings;

pub use leases::{LeaseRow, LeaseTable};
pub use server::{Management, ManagementError, install_metrics};
pub use settings::ManagementSettings;
