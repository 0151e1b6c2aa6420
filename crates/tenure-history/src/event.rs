//! The event kinds of a history line, one variant each, with their fields
//! (docs/history.md lists the same kinds; a test holds the two together).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What happened, tagged by the line's `event` field. Field names are the JSON keys; a
/// field that is an `Option` may be absent from older or hand-made lines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    // Lease events, from every LeaseActor of the node.
    /// An acquire attempt was sent to the store.
    LeaseAcquire {
        /// The lease name.
        lease: String,
        /// The owner the node acquires for (its `host:port`).
        owner: String,
    },
    /// A new grant is believed from `t` until `valid_until` (the holder's local deadline).
    LeaseGranted {
        /// The lease name.
        lease: String,
        /// The owner the node acquires for (its `host:port`).
        owner: String,
        /// The grant's fencing token.
        token: u64,
        /// The holder's local deadline (ns, the clock of `t`): send instant of the request +
        /// ttl − safety margin.
        valid_until: i64,
    },
    /// The store answered: held by another owner.
    LeaseNotGranted {
        /// The lease name.
        lease: String,
        /// The owner that asked.
        owner: String,
        /// The owner the store says holds the lease.
        holder: String,
    },
    /// A renewal was confirmed; the belief now lasts until `valid_until`.
    LeaseRenewed {
        /// The lease name.
        lease: String,
        /// The owner that renewed.
        owner: String,
        /// The renewed grant's fencing token.
        token: u64,
        /// The new local deadline (ns, the clock of `t`).
        valid_until: i64,
    },
    /// The holder stopped believing it holds the lease (`expired`, `not_held`, `preempted`).
    LeaseLost {
        /// The lease name.
        lease: String,
        /// The owner that lost it.
        owner: String,
        /// The lost grant's fencing token.
        token: u64,
        /// Why: `expired` (deadline passed without a confirmed renewal), `not_held` (the store said
        /// so) or `preempted` (a higher-priority owner's forceful request refused the renewal).
        reason: String,
    },
    /// Renewals of the grant started failing before its deadline: held, in doubt.
    LeaseSuspended {
        /// The lease name.
        lease: String,
        /// The owner holding the suspended grant.
        owner: String,
        /// The suspended grant's fencing token.
        token: u64,
        /// The renewal's error (or the timeout), as text.
        error: String,
    },
    /// A renewal of the suspended grant succeeded: held again, same token.
    LeaseResumed {
        /// The lease name.
        lease: String,
        /// The owner holding the grant.
        owner: String,
        /// The grant's fencing token (unchanged by the suspension).
        token: u64,
    },
    /// The holder gave the grant up to release it (the belief ends here).
    LeaseReleased {
        /// The lease name.
        lease: String,
        /// The owner giving it up.
        owner: String,
        /// The released grant's fencing token.
        token: u64,
    },
    /// A store call whose outcome is unknown (`op`: `acquire`, `renew`, `release`).
    LeaseError {
        /// The lease name.
        lease: String,
        /// The owner the call was for.
        owner: String,
        /// The store call: `acquire`, `renew` or `release`.
        op: String,
        /// The error (or timeout), as text.
        error: String,
    },

    // Guarded commands (`tenure lease run --history`).
    /// The command was started while holding the grant `token` (`pid`: `None` when it had
    /// already exited).
    CommandStarted {
        /// The lease name.
        lease: String,
        /// The fencing token of the grant the command was started under.
        token: u64,
        /// The command's process id; `None` when it had already exited.
        pid: Option<u32>,
    },
    /// The command is gone (`exited`, `lost`, `preempted`, `interrupted`, `terminated`).
    CommandStopped {
        /// The lease name.
        lease: String,
        /// The fencing token of the grant the command ran under.
        token: u64,
        /// Why it is gone: `exited`, `lost`, `preempted`, `interrupted` or `terminated`.
        why: String,
    },

    // Fenced writes and the load's answers.
    /// An entity wrote to a fenced resource (the example counter of key `entity`).
    Write {
        /// The entity type (JSON key `type`).
        #[serde(rename = "type")]
        entity_type: String,
        /// The entity's shard.
        shard: String,
        /// The entity id (the counter's key).
        entity: String,
        /// The fencing token presented with the write.
        token: u64,
        /// The counter after the write: the resource's own order.
        value: Option<u64>,
        /// Whether the resource accepted the write; `false`: it had seen a higher token.
        accepted: bool,
    },
    /// A singleton wrote to its fenced counter.
    Tick {
        /// The singleton's name.
        singleton: String,
        /// The fencing token presented with the write.
        token: u64,
        /// The counter after the write: the resource's own order.
        value: Option<u64>,
        /// Whether the counter accepted the write; `false`: it had seen a higher token.
        accepted: bool,
    },
    /// A client got the answer to an increment (`from`: the node that answered).
    Ack {
        /// The entity id (the counter's key).
        entity: String,
        /// The entity's shard.
        shard: String,
        /// The counter value acknowledged.
        value: u64,
        /// The fencing token of the write that made `value`.
        token: u64,
        /// The node that answered.
        from: String,
        /// When the request was sent (ns, the clock of `t`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        issued: Option<i64>,
    },
    /// A request of the load ended without an acknowledgement.
    NoAck {
        /// The entity id (the counter's key).
        entity: String,
        /// The entity's shard.
        shard: String,
        /// When the request was sent (ns, the clock of `t`); it ended at `t`.
        issued: i64,
        /// Why: no answer within the timeout, an error, or the counter refused the write.
        why: String,
    },

    // The node and its view of the membership.
    /// The node process started.
    NodeStarted {},
    /// The node left the cluster.
    NodeLeft {},
    /// The process ends itself at once (`abort(3)`): `what` (an entity, a singleton
    /// instance), running under the grant `token` of `lease`, outlived its kill while that
    /// grant is being lost. Every life of this incarnation ends here.
    ProcessAbort {
        /// The lease of the grant being lost.
        lease: String,
        /// The grant's fencing token.
        token: u64,
        /// What outlived its kill, e.g. `entity key-7 of counter shard 3`.
        what: String,
    },
    /// Refused at join: this node places entities differently from `member`.
    NodeRefused {
        /// The member whose settings differ.
        member: String,
        /// The setting that differs.
        key: String,
        /// This node's value of the setting.
        mine: String,
        /// The member's value of the setting.
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
    SbrDowned {
        /// The member downed.
        member: String,
        /// The name of the resolver's strategy that decided.
        strategy: String,
    },
    /// The split brain resolver: this node's side goes, it downs itself.
    SbrDownSelf {
        /// Why; names the operator when an operator downed this node.
        why: String,
    },
    /// A node downed itself in a cluster without a resolver (it rejoins at once).
    DownSelf {
        /// Why the node downed itself.
        why: String,
    },
    /// A downed node hears every member again and rejoins.
    SbrRejoining {},
    /// An operator's request: this node dropped `member` from its view.
    OperatorDowned {
        /// The member dropped.
        member: String,
        /// The dropped membership's age (its order of joining).
        age: u64,
        /// Why: names the operator and the node that took the request.
        why: String,
    },
    /// An operator asked this node to leave.
    LeaveRequested {
        /// Who asked, e.g. `management 127.0.0.1:8558`.
        by: String,
    },
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
        /// The singleton's name.
        singleton: String,
        /// The node whose instance answered.
        from: String,
        /// The fencing token the instance runs under, if it said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<u64>,
        /// The counter value answered, if any.
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
    /// The entity outlived its kill (a thread blocked outside an await): its shard keeps
    /// the lease until it ends.
    EntityZombie(EntityLife),
    /// The shard coordinator, which had no home for the shard, allocated it to `to`.
    ShardAllocated {
        /// The entity type (JSON key `type`).
        #[serde(rename = "type")]
        entity_type: String,
        /// The shard allocated.
        shard: String,
        /// The node told to host it.
        to: String,
    },
    /// Whether the shard coordinator on this node may give the region shards from now on
    /// (registered, available, up and reachable; before the newest-version filter), when
    /// that changed.
    RegionAllocatable {
        /// The entity type (JSON key `type`).
        #[serde(rename = "type")]
        entity_type: String,
        /// The region's node.
        region: String,
        /// Its application version (`cluster.app-version`).
        version: String,
        /// Whether it may be given shards.
        allocatable: bool,
    },
    /// A rebalance moves the shard; its hand-off begins.
    ShardMoving {
        /// The entity type (JSON key `type`).
        #[serde(rename = "type")]
        entity_type: String,
        /// The shard moving.
        shard: String,
        /// The node the shard leaves.
        from: String,
        /// The node the shard goes to.
        to: String,
    },
    /// The hand-off ended and `to`, the shard's new home (`None`: no region could take it),
    /// was told.
    ShardMoved {
        /// The entity type (JSON key `type`).
        #[serde(rename = "type")]
        entity_type: String,
        /// The shard moved.
        shard: String,
        /// The node the shard left.
        from: String,
        /// Its new home; `None` when no region could take it.
        to: Option<String>,
        /// Whether the old home released the shard's lease.
        released: bool,
    },

    // Durable entities (tenure-sharding's `durable` module).
    /// A durable entity's journal committed its events `from_seq..=to_seq`, fenced by the
    /// shard lease's grant `token`.
    JournalAppended {
        /// The entity type (JSON key `type`).
        #[serde(rename = "type")]
        entity_type: String,
        /// The entity's shard.
        shard: String,
        /// The entity id.
        entity: String,
        /// The fencing token of the shard lease's grant the append was fenced by.
        token: u64,
        /// The sequence number of the first event appended.
        from_seq: u64,
        /// The sequence number of the last event appended.
        to_seq: u64,
        /// When the append was sent to the journal (ns, the clock of `t`); it committed
        /// between `issued` and `t`.
        issued: i64,
    },
    /// The journal refused a durable entity's append (nothing was written) and the entity
    /// stops: its grant `token` is not current (`reason` `not_held`) or the journal's next
    /// sequence number is not `seq` (`sequence`).
    JournalRefused {
        /// The entity type (JSON key `type`).
        #[serde(rename = "type")]
        entity_type: String,
        /// The entity's shard.
        shard: String,
        /// The entity id.
        entity: String,
        /// The fencing token the append presented.
        token: u64,
        /// The sequence number the append expected to get.
        seq: u64,
        /// Why: `not_held` or `sequence`.
        reason: String,
        /// When the append was sent to the journal (ns, the clock of `t`).
        issued: i64,
    },
    /// A durable entity recovered its state from its journal: the latest snapshot (at
    /// `snapshot`, if any), then the events after it, up to `seq`.
    EntityRecovered {
        /// The entity type (JSON key `type`).
        #[serde(rename = "type")]
        entity_type: String,
        /// The entity's shard.
        shard: String,
        /// The entity id.
        entity: String,
        /// The fencing token of the grant the entity runs under.
        token: u64,
        /// The sequence number of the last event the recovered state includes (0: none).
        seq: u64,
        /// The sequence number of the snapshot it started from, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        snapshot: Option<u64>,
        /// When the recovery began reading the journal (ns, the clock of `t`).
        issued: i64,
        /// The FNV-1a 64 digest of the recovered state's JSON encoding, in hex
        /// ([`state_digest`](crate::check::state_digest)).
        digest: String,
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
        /// How many sessions ended, if known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sessions: Option<u64>,
    },
    /// Another process acquiring `lease` as the node's owner started.
    SecondOwnerStarted {
        /// The lease name.
        lease: String,
    },
    /// It stopped (`status`: its exit code, if it exited).
    SecondOwnerStopped {
        /// The lease name.
        lease: String,
        /// The process's exit code; `None` when a signal ended it.
        #[serde(default)]
        status: Option<i32>,
    },
    /// The store was restarted.
    StoreRestarted {},
    /// The node's wall clock moved by `offset` (monotonic clocks untouched).
    ClockJump {
        /// How far the wall clock moved, as `faketime` takes it (e.g. `+2h`).
        offset: String,
    },
    /// From here until healed, every node's example entities and singletons stop slowly.
    SlowStop {},
    /// The example entity `entity` blocks its thread (`std::thread::sleep` in its handler)
    /// on `node`, which hosts it, for longer than the ttl.
    ThreadBlocked {
        /// The entity id.
        entity: String,
    },
    /// The SQLite lease file deleted while in use or, `restored`, replaced by an older copy.
    StoreLost {
        /// `Some(true)`: replaced by an older copy rather than deleted.
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
    /// The member (`host:port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// The member's incarnation (hex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_inc: Option<String>,
    /// The member's age (its order of joining; lower is older).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age: Option<u64>,
    /// The member's status as seen by `node` (e.g. `up`, `leaving`, `down`).
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
    /// The peer (`host:port`), in the node's own record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// The node's fault: `stall`, `inbound`, `outbound` or `drop`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
    /// The peer (`host:port`), in a harness's record.
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
    /// The singleton's name.
    pub singleton: String,
    /// The fencing token of the grant the instance runs under.
    pub token: u64,
    /// Why, when there is something to say (empty otherwise).
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
    /// The entity type (JSON key `type`).
    #[serde(rename = "type")]
    pub entity_type: String,
    /// The shard id.
    pub shard: String,
    /// The fencing token of the shard lease's grant the shard serves under.
    pub token: u64,
    /// Why, when there is something to say (empty otherwise).
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
    /// The entity type (JSON key `type`).
    #[serde(rename = "type")]
    pub entity_type: String,
    /// The entity's shard.
    pub shard: String,
    /// The entity id.
    pub entity: String,
    /// The fencing token of the shard lease's grant the entity runs under.
    pub token: u64,
    /// Why, when there is something to say (empty otherwise).
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
            | Event::ProcessAbort { lease, .. }
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
            | Event::ProcessAbort { token, .. }
            | Event::Write { token, .. }
            | Event::Tick { token, .. }
            | Event::Ack { token, .. }
            | Event::JournalAppended { token, .. }
            | Event::JournalRefused { token, .. }
            | Event::EntityRecovered { token, .. } => Some(*token),
            Event::ProxyReply { token, .. } => *token,
            Event::SingletonStarting(l)
            | Event::SingletonStarted(l)
            | Event::SingletonStopped(l)
            | Event::SingletonZombie(l)
            | Event::SingletonLeaseLost(l) => Some(l.token),
            Event::ShardStarted(l) | Event::ShardStopped(l) | Event::ShardLeaseLost(l) => {
                Some(l.token)
            }
            Event::EntityStarted(l) | Event::EntityStopped(l) | Event::EntityZombie(l) => {
                Some(l.token)
            }
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
            Event::EntityStarted(l) | Event::EntityStopped(l) | Event::EntityZombie(l) => {
                Some(&l.why)
            }
            _ => None,
        }
    }

    /// Whether this is a write to a fenced resource it accepted (`write` or `tick` with
    /// `accepted`, or `journal_appended`).
    pub fn accepted_write(&self) -> bool {
        matches!(
            self,
            Event::Write { accepted: true, .. }
                | Event::Tick { accepted: true, .. }
                | Event::JournalAppended { .. }
        )
    }
}
