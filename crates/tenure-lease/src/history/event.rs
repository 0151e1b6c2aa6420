//! The event kinds of a history line, one variant each, with their fields
//! (docs/history.md lists the same kinds; a test holds the two together).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::LeaseTrace;

/// What happened, tagged by the line's `event` field. Field names are the JSON keys; a
/// field that is an `Option` may be absent from older or hand-made lines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    // Lease events, from every LeaseActor of the node.
    /// An acquire attempt was sent to the store.
    LeaseAcquire { lease: String, owner: String },
    /// A new grant is believed from `t` until `valid_until` (the holder's local deadline).
    LeaseGranted {
        lease: String,
        owner: String,
        token: u64,
        valid_until: i64,
    },
    /// The store answered: held by another owner.
    LeaseNotGranted {
        lease: String,
        owner: String,
        holder: String,
    },
    /// A renewal was confirmed; the belief now lasts until `valid_until`.
    LeaseRenewed {
        lease: String,
        owner: String,
        token: u64,
        valid_until: i64,
    },
    /// The holder stopped believing it holds the lease (`expired`, `not_held`, `preempted`).
    LeaseLost {
        lease: String,
        owner: String,
        token: u64,
        reason: String,
    },
    /// Renewals of the grant started failing before its deadline: held, in doubt.
    LeaseSuspended {
        lease: String,
        owner: String,
        token: u64,
        error: String,
    },
    /// A renewal of the suspended grant succeeded: held again, same token.
    LeaseResumed {
        lease: String,
        owner: String,
        token: u64,
    },
    /// The holder gave the grant up to release it (the belief ends here).
    LeaseReleased {
        lease: String,
        owner: String,
        token: u64,
    },
    /// A store call whose outcome is unknown (`op`: `acquire`, `renew`, `release`).
    LeaseError {
        lease: String,
        owner: String,
        op: String,
        error: String,
    },

    // Guarded commands (`tenure lease run --history`).
    /// The command was started while holding the grant `token` (`pid`: `None` when it had
    /// already exited).
    CommandStarted {
        lease: String,
        token: u64,
        pid: Option<u32>,
    },
    /// The command is gone (`exited`, `lost`, `preempted`, `interrupted`, `terminated`).
    CommandStopped {
        lease: String,
        token: u64,
        why: String,
    },

    // Fenced writes and the load's answers.
    /// An entity wrote to a fenced resource (the example counter of key `entity`).
    Write {
        #[serde(rename = "type")]
        entity_type: String,
        shard: String,
        entity: String,
        token: u64,
        /// The counter after the write: the resource's own order.
        value: Option<u64>,
        accepted: bool,
    },
    /// A singleton wrote to its fenced counter.
    Tick {
        singleton: String,
        token: u64,
        value: Option<u64>,
        accepted: bool,
    },
    /// A client got the answer to an increment (`from`: the node that answered).
    Ack {
        entity: String,
        shard: String,
        value: u64,
        token: u64,
        from: String,
        /// When the request was sent (ns, the clock of `t`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        issued: Option<i64>,
    },
    /// A request of the load ended without an acknowledgement.
    NoAck {
        entity: String,
        shard: String,
        issued: i64,
        why: String,
    },

    // The node and its view of the membership.
    /// The node process started.
    NodeStarted {},
    /// The node left the cluster.
    NodeLeft {},
    /// Refused at join: this node places entities differently from `member`.
    NodeRefused {
        member: String,
        key: String,
        mine: String,
        theirs: String,
    },
    /// A member joined (as seen by `node`).
    MemberJoined(AboutMember),
    /// A member is up.
    MemberUp(AboutMember),
    /// A member is leaving.
    MemberLeaving(AboutMember),
    /// A member is down.
    MemberDown(AboutMember),
    /// A member was removed.
    MemberRemoved(AboutMember),
    /// A member became unreachable.
    Unreachable(AboutMember),
    /// A member became reachable again.
    Reachable(AboutMember),
    /// This node is down without having asked to leave.
    SelfDown {},
    /// This node is leaving.
    SelfLeaving {},
    /// The split brain resolver: this side survived and downed `member`.
    SbrDowned { member: String, strategy: String },
    /// The split brain resolver: this node's side goes, it downs itself.
    SbrDownSelf { why: String },
    /// A node downed itself in a cluster without a resolver (it rejoins at once).
    DownSelf { why: String },
    /// A downed node hears every member again and rejoins.
    SbrRejoining {},
    /// An operator's request: this node dropped `member` from its view.
    OperatorDowned {
        member: String,
        age: u64,
        why: String,
    },
    /// An operator asked this node to leave.
    LeaveRequested { by: String },
    /// Fault injection on a link: from the node (`member`, `fault`) or from a harness
    /// (`peer`, `mode`: `stall`, `drop` or `outbound`).
    LinkCut(Link),
    /// The link is healed (same fields as [`Event::LinkCut`]).
    LinkHealed(Link),

    // Singletons.
    /// The instance is spawned; its `pre_start` may act from here.
    SingletonStarting(SingletonLife),
    /// Its `pre_start` finished.
    SingletonStarted(SingletonLife),
    /// It and its descendants have terminated.
    SingletonStopped(SingletonLife),
    /// One survived its kill.
    SingletonZombie(SingletonLife),
    /// The singleton's lease was lost.
    SingletonLeaseLost(SingletonLife),
    /// A proxy got an answer from the singleton on `from`.
    ProxyReply {
        singleton: String,
        from: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<u64>,
    },

    // Sharding.
    /// A shard serves on this node.
    ShardStarted(ShardLife),
    /// The shard stopped serving.
    ShardStopped(ShardLife),
    /// The shard's lease was lost.
    ShardLeaseLost(ShardLife),
    /// The entity's actor is spawned; its `start` may act from here.
    EntityStarted(EntityLife),
    /// The entity has terminated.
    EntityStopped(EntityLife),
    /// A rebalance moves the shard; its hand-off begins.
    ShardMoving {
        #[serde(rename = "type")]
        entity_type: String,
        shard: String,
        from: String,
        to: String,
    },
    /// The hand-off ended and `to`, the shard's new home (`None`: no region could take it),
    /// was told.
    ShardMoved {
        #[serde(rename = "type")]
        entity_type: String,
        shard: String,
        from: String,
        to: Option<String>,
        released: bool,
    },

    // Faults, written by a harness (`inc` = `harness`; `node` is the target, or `store`).
    /// SIGKILL.
    Killed {},
    /// SIGSTOP.
    Paused {},
    /// SIGCONT.
    Resumed {},
    /// SIGTERM sent: a graceful leave begins.
    Leaving {},
    /// The process exited after SIGTERM.
    Terminated {},
    /// The node was started again (a new incarnation).
    Restarted {},
    /// Traffic between the node and every other node stalled.
    Isolated {},
    /// The isolation ended.
    IsolationHealed {},
    /// The node's connections to the store stalled.
    StoreCut {},
    /// They resumed.
    StoreHealed {},
    /// The SQLite lease file write-locked: every node's renewals fail.
    StoreLocked {},
    /// The lock is gone.
    StoreUnlocked {},
    /// The store's answers delayed past the operation timeout.
    StoreSlow {},
    /// On time again.
    StoreOnTime {},
    /// The node's store sessions ended on the server (`sessions`: how many).
    SessionExpired {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sessions: Option<u64>,
    },
    /// Another process acquiring `lease` as the node's owner started.
    SecondOwnerStarted { lease: String },
    /// It stopped (`status`: its exit code, if it exited).
    SecondOwnerStopped {
        lease: String,
        #[serde(default)]
        status: Option<i32>,
    },
    /// The store was restarted.
    StoreRestarted {},
    /// The node's wall clock moved by `offset` (monotonic clocks untouched).
    ClockJump { offset: String },
    /// From here until healed, every node's example entities and singletons stop slowly.
    SlowStop {},
    /// The SQLite lease file deleted while in use or, `restored`, replaced by an older copy.
    StoreLost {
        #[serde(default)]
        restored: Option<bool>,
    },

    /// An event kind this build does not know, kept whole for forward compatibility
    /// (docs/history.md: readers ignore kinds they do not know). Never written by Tenure.
    #[serde(skip)]
    Other {
        /// The line's `event`.
        kind: String,
        /// The line's other fields, except `t`, `node` and `inc`.
        fields: Map<String, Value>,
    },
}

/// The member a membership event is about; absent on events about the node itself.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AboutMember {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_inc: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

impl AboutMember {
    /// A membership event about `member` (its incarnation, age and status).
    pub fn of(member: String, member_inc: String, age: u64, status: String) -> AboutMember {
        AboutMember {
            member: Some(member),
            member_inc: Some(member_inc),
            age: Some(age),
            status: Some(status),
        }
    }
}

/// A link fault, as the node records it (`member`, `fault`) or a harness (`peer`, `mode`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Link {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// A harness writes `null` on a heal: kept so, as `None` serializes.
    #[serde(default)]
    pub mode: Option<String>,
}

impl Link {
    /// The node's own record of its link to `member`.
    pub fn on_node(member: String, fault: String) -> Link {
        Link {
            member: Some(member),
            fault: Some(fault),
            ..Link::default()
        }
    }

    /// A harness's record of the link to `peer` (`mode` `None`: healed).
    pub fn by_harness(peer: String, mode: Option<String>) -> Link {
        Link {
            peer: Some(peer),
            mode,
            ..Link::default()
        }
    }
}

/// A singleton instance's life event under the grant `token`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SingletonLife {
    pub singleton: String,
    pub token: u64,
    #[serde(default)]
    pub why: String,
}

impl SingletonLife {
    /// Singleton `singleton`, grant `token`, and why (empty when there is nothing to say).
    pub fn new(singleton: String, token: u64, why: String) -> SingletonLife {
        SingletonLife {
            singleton,
            token,
            why,
        }
    }
}

/// A shard's life event on its node under the grant `token`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ShardLife {
    #[serde(rename = "type")]
    pub entity_type: String,
    pub shard: String,
    pub token: u64,
    #[serde(default)]
    pub why: String,
}

impl ShardLife {
    /// Shard `shard` of `entity_type`, grant `token`, and why.
    pub fn new(entity_type: String, shard: String, token: u64, why: String) -> ShardLife {
        ShardLife {
            entity_type,
            shard,
            token,
            why,
        }
    }
}

/// An entity's life event in its shard under the grant `token`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EntityLife {
    #[serde(rename = "type")]
    pub entity_type: String,
    pub shard: String,
    pub entity: String,
    pub token: u64,
    #[serde(default)]
    pub why: String,
}

impl EntityLife {
    /// Entity `entity` of shard `shard` of `entity_type`, grant `token`, and why.
    pub fn new(
        entity_type: String,
        shard: String,
        entity: String,
        token: u64,
        why: String,
    ) -> EntityLife {
        EntityLife {
            entity_type,
            shard,
            entity,
            token,
            why,
        }
    }
}

impl Event {
    /// The `lease_*` event of a LeaseActor's trace of lease `lease` held for `owner`.
    pub fn from_trace(lease: &str, owner: &str, trace: &LeaseTrace) -> Event {
        let (lease, owner) = (lease.to_string(), owner.to_string());
        match trace {
            LeaseTrace::AcquireInvoked => Event::LeaseAcquire { lease, owner },
            &LeaseTrace::Granted { token, valid_until } => Event::LeaseGranted {
                lease,
                owner,
                token: token.get(),
                valid_until,
            },
            LeaseTrace::NotGranted { holder } => Event::LeaseNotGranted {
                lease,
                owner,
                holder: holder.clone(),
            },
            &LeaseTrace::Renewed { token, valid_until } => Event::LeaseRenewed {
                lease,
                owner,
                token: token.get(),
                valid_until,
            },
            &LeaseTrace::Lost { token, reason } => Event::LeaseLost {
                lease,
                owner,
                token: token.get(),
                reason: reason.to_string(),
            },
            LeaseTrace::Suspended { token, error } => Event::LeaseSuspended {
                lease,
                owner,
                token: token.get(),
                error: error.clone(),
            },
            &LeaseTrace::Resumed { token } => Event::LeaseResumed {
                lease,
                owner,
                token: token.get(),
            },
            &LeaseTrace::Released { token } => Event::LeaseReleased {
                lease,
                owner,
                token: token.get(),
            },
            LeaseTrace::Error { operation, error } => Event::LeaseError {
                lease,
                owner,
                op: operation.to_string(),
                error: error.clone(),
            },
        }
    }

    /// The lease a `lease_*` or command event is about.
    pub fn lease(&self) -> Option<&str> {
        match self {
            Event::LeaseAcquire { lease, .. }
            | Event::LeaseGranted { lease, .. }
            | Event::LeaseNotGranted { lease, .. }
            | Event::LeaseRenewed { lease, .. }
            | Event::LeaseLost { lease, .. }
            | Event::LeaseSuspended { lease, .. }
            | Event::LeaseResumed { lease, .. }
            | Event::LeaseReleased { lease, .. }
            | Event::LeaseError { lease, .. }
            | Event::CommandStarted { lease, .. }
            | Event::CommandStopped { lease, .. }
            | Event::SecondOwnerStarted { lease }
            | Event::SecondOwnerStopped { lease, .. } => Some(lease),
            _ => None,
        }
    }

    /// The fencing token the event names, if any.
    pub fn token(&self) -> Option<u64> {
        match self {
            Event::LeaseGranted { token, .. }
            | Event::LeaseRenewed { token, .. }
            | Event::LeaseLost { token, .. }
            | Event::LeaseSuspended { token, .. }
            | Event::LeaseResumed { token, .. }
            | Event::LeaseReleased { token, .. }
            | Event::CommandStarted { token, .. }
            | Event::CommandStopped { token, .. }
            | Event::Write { token, .. }
            | Event::Tick { token, .. }
            | Event::Ack { token, .. } => Some(*token),
            Event::ProxyReply { token, .. } => *token,
            Event::SingletonStarting(l)
            | Event::SingletonStarted(l)
            | Event::SingletonStopped(l)
            | Event::SingletonZombie(l)
            | Event::SingletonLeaseLost(l) => Some(l.token),
            Event::ShardStarted(l) | Event::ShardStopped(l) | Event::ShardLeaseLost(l) => {
                Some(l.token)
            }
            Event::EntityStarted(l) | Event::EntityStopped(l) => Some(l.token),
            _ => None,
        }
    }

    /// The `why` of events that say why (stops, losses, refused loads).
    pub fn why(&self) -> Option<&str> {
        match self {
            Event::CommandStopped { why, .. }
            | Event::NoAck { why, .. }
            | Event::SbrDownSelf { why }
            | Event::DownSelf { why }
            | Event::OperatorDowned { why, .. } => Some(why),
            Event::SingletonStarting(l)
            | Event::SingletonStarted(l)
            | Event::SingletonStopped(l)
            | Event::SingletonZombie(l)
            | Event::SingletonLeaseLost(l) => Some(&l.why),
            Event::ShardStarted(l) | Event::ShardStopped(l) | Event::ShardLeaseLost(l) => {
                Some(&l.why)
            }
            Event::EntityStarted(l) | Event::EntityStopped(l) => Some(&l.why),
            _ => None,
        }
    }

    /// Whether this is a write to a fenced resource (`write` or `tick`) it accepted.
    pub fn accepted_write(&self) -> bool {
        matches!(
            self,
            Event::Write { accepted: true, .. } | Event::Tick { accepted: true, .. }
        )
    }
}
