//! The split brain resolver: one downing decision per node for the whole cluster (Akka's
//! SBR). Reachability observations travel in heartbeats ([`ReachTable`]); once they have
//! not changed for `stable-after`, each node decides with the configured [`Strategy`]
//! whether its side survives (it downs the other side in its view) or goes (it downs
//! itself: stops what it hosts, releases its leases, and rejoins or exits).
//!
//! Safety never depends on this decision: shards and singletons are guarded by their own
//! leases. The resolver brings availability: the surviving side stops waiting for members
//! it cannot hear, and the losing side gives its leases up instead of renewing them.

mod spread;
mod strategy;
mod table;

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Deserialize;
use tenure_lease::ConfigError;
use tokio::time::Instant;

pub use spread::{REPEAT, Spread};
pub use strategy::{Decision, Partition, Strategy, decide};
pub use table::{Carrier, Life, ReachRow, ReachTable, SharedRow};

use crate::identity::NodeAddr;

/// What a node that downed itself does next (`when-down`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WhenDown {
    /// Waits until it hears every member again, then joins as a new (youngest) member.
    #[default]
    Rejoin,
    /// Stops the node: [`Node::stopped`](crate::Node::stopped) answers
    /// [`ClusterError::Downed`](crate::ClusterError::Downed).
    Exit,
}

/// `[cluster.split-brain-resolver]` resolved (Akka's setting names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SbrSettings {
    /// `active-strategy` with its own section's options.
    pub strategy: Strategy,
    /// The strategy section's `role`: only members with it are counted (`None`: all).
    pub role: Option<String>,
    /// `stable-after`: how long the reachability observations must stay unchanged before
    /// deciding.
    pub stable_after: Duration,
    /// `down-all-when-unstable`: when observations keep changing for `stable-after` plus
    /// this, every node downs itself (`None`: off).
    pub down_all_when_unstable: Option<Duration>,
    /// `when-down`.
    pub when_down: WhenDown,
}

/// The strategy names of `active-strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyName {
    /// `keep-majority`: the side with more than half of the members survives.
    KeepMajority,
    /// `lease-majority` (the default): the side that acquires the `<system>-sbr` lease
    /// survives.
    #[default]
    LeaseMajority,
    /// `static-quorum`: a side with at least `quorum-size` members survives.
    StaticQuorum,
    /// `keep-oldest`: the side with the oldest member survives.
    KeepOldest,
    /// `down-all`: every side downs itself.
    DownAll,
    /// No resolver.
    Off,
}

/// `down-all-when-unstable`: `"on"` (3/4 of `stable-after`), `"off"`, or a duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DownAllWhenUnstable {
    /// `"on"`: after 3/4 of `stable-after` of instability.
    #[default]
    On,
    /// `"off"`: never.
    Off,
    /// A duration: after that long of instability.
    After(Duration),
}

impl<'de> Deserialize<'de> for DownAllWhenUnstable {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Text {
            Flag(bool),
            Text(String),
        }
        let bad = || D::Error::custom("expected \"on\", \"off\" or a duration such as \"5s\"");
        Ok(match Text::deserialize(d).map_err(|_| bad())? {
            Text::Flag(true) => DownAllWhenUnstable::On,
            Text::Flag(false) => DownAllWhenUnstable::Off,
            Text::Text(t) if t == "on" => DownAllWhenUnstable::On,
            Text::Text(t) if t == "off" => DownAllWhenUnstable::Off,
            Text::Text(t) => match tenure_lease::duration::parse(&t).map_err(D::Error::custom)? {
                d if d.is_zero() => return Err(bad()),
                d => DownAllWhenUnstable::After(d),
            },
        })
    }
}

/// The options of a strategy that has none but `role`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct RoleOnly {
    /// `role`: count only members with it (`None`: every member).
    pub role: Option<String>,
}

/// `[cluster.split-brain-resolver.lease-majority]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct LeaseMajorityConfig {
    /// `role`: count only members with it (`None`: every member).
    pub role: Option<String>,
    /// `acquire-lease-delay-for-minority`: how long the smaller side waits before it tries
    /// for the resolver lease.
    #[serde(deserialize_with = "tenure_lease::duration::serde::required")]
    pub acquire_lease_delay_for_minority: Duration,
    /// `release-after`: how long the winner keeps the resolver lease before it releases it.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub release_after: Duration,
}

impl Default for LeaseMajorityConfig {
    fn default() -> Self {
        LeaseMajorityConfig {
            role: None,
            acquire_lease_delay_for_minority: Duration::from_secs(2),
            release_after: Duration::from_secs(40),
        }
    }
}

/// `[cluster.split-brain-resolver.static-quorum]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct StaticQuorumConfig {
    /// `role`: count only members with it (`None`: every member).
    pub role: Option<String>,
    /// `quorum-size`: required when static-quorum is active.
    pub quorum_size: Option<usize>,
}

/// `[cluster.split-brain-resolver.keep-oldest]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct KeepOldestConfig {
    /// `role`: count only members with it (`None`: every member).
    pub role: Option<String>,
    /// `down-if-alone`: the oldest member downs itself when it is alone on its side.
    pub down_if_alone: bool,
}

impl Default for KeepOldestConfig {
    fn default() -> Self {
        KeepOldestConfig {
            role: None,
            down_if_alone: true,
        }
    }
}

/// `[cluster.split-brain-resolver]` as written, with its strategies' sub-tables (each field
/// is the key of the same name in kebab-case); [`resolve`](Self::resolve) checks it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct SbrConfig {
    /// `active-strategy`: the strategy that decides.
    pub active_strategy: StrategyName,
    /// `stable-after`: how long reachability must hold still before a decision.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub stable_after: Duration,
    /// `down-all-when-unstable`: when a cluster that never holds still downs every member.
    pub down_all_when_unstable: DownAllWhenUnstable,
    /// `when-down`: what a downed node does.
    pub when_down: WhenDown,
    /// `[…keep-majority]`.
    pub keep_majority: RoleOnly,
    /// `[…lease-majority]`.
    pub lease_majority: LeaseMajorityConfig,
    /// `[…static-quorum]`.
    pub static_quorum: StaticQuorumConfig,
    /// `[…keep-oldest]`.
    pub keep_oldest: KeepOldestConfig,
    /// `[…down-all]`.
    pub down_all: RoleOnly,
}

impl Default for SbrConfig {
    fn default() -> Self {
        SbrConfig {
            active_strategy: StrategyName::default(),
            stable_after: Duration::from_secs(7),
            down_all_when_unstable: DownAllWhenUnstable::default(),
            when_down: WhenDown::default(),
            keep_majority: RoleOnly::default(),
            lease_majority: LeaseMajorityConfig::default(),
            static_quorum: StaticQuorumConfig::default(),
            keep_oldest: KeepOldestConfig::default(),
            down_all: RoleOnly::default(),
        }
    }
}

impl SbrConfig {
    /// The resolver's settings; `None` when `active-strategy = "off"`. Errors name the key.
    pub fn resolve(&self) -> Result<Option<SbrSettings>, ConfigError> {
        const AT: &str = "cluster.split-brain-resolver";
        let (strategy, role) = match self.active_strategy {
            StrategyName::Off => return Ok(None),
            StrategyName::KeepMajority => (Strategy::KeepMajority, &self.keep_majority.role),
            StrategyName::StaticQuorum => {
                let quorum_size = self.static_quorum.quorum_size.filter(|n| *n > 0).ok_or_else(|| {
                    ConfigError::invalid(
                        format!("{AT}.static-quorum.quorum-size"),
                        "static-quorum needs a positive quorum-size (more than half of the cluster's size)",
                    )
                })?;
                (
                    Strategy::StaticQuorum { quorum_size },
                    &self.static_quorum.role,
                )
            }
            StrategyName::KeepOldest => (
                Strategy::KeepOldest {
                    down_if_alone: self.keep_oldest.down_if_alone,
                },
                &self.keep_oldest.role,
            ),
            StrategyName::DownAll => (Strategy::DownAll, &self.down_all.role),
            StrategyName::LeaseMajority => (
                Strategy::LeaseMajority {
                    acquire_delay_for_minority: self
                        .lease_majority
                        .acquire_lease_delay_for_minority,
                    release_after: self.lease_majority.release_after,
                },
                &self.lease_majority.role,
            ),
        };
        Ok(Some(SbrSettings {
            strategy,
            role: role.clone(),
            stable_after: self.stable_after,
            down_all_when_unstable: match self.down_all_when_unstable {
                DownAllWhenUnstable::On => Some(self.stable_after * 3 / 4),
                DownAllWhenUnstable::Off => None,
                DownAllWhenUnstable::After(d) => Some(d),
            },
            when_down: self.when_down,
        }))
    }
}

/// When to decide: the observations must hold still for `stable-after`; one decision per
/// stable situation.
#[derive(Debug)]
pub struct Resolver {
    settings: SbrSettings,
    /// The unreachable and indirectly connected members of the last step (the orphans
    /// among the unreachable): what the situation is decided on.
    seen: (BTreeSet<NodeAddr>, BTreeSet<NodeAddr>),
    /// Members of the situation no longer listed only because the observers that listed
    /// them left the view ([`Resolver::unlisted_by_departures`]): still unreachable here
    /// while they are members and the situation lasts.
    orphans: BTreeSet<NodeAddr>,
    changed_at: Instant,
    /// Since when members have been unreachable without a decision.
    unstable_since: Option<Instant>,
    decided: bool,
    /// A situation awaits its decision: it was not whole when it last changed (members
    /// leaving the view since do not close it, see [`Resolver::step`]).
    open: bool,
    /// Members no longer listed since the last step because every row that listed them was
    /// of a member that left the view (see [`Resolver::unlisted_by_departures`]).
    unlisted: BTreeSet<NodeAddr>,
}

/// What [`Resolver::step`] asks of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do now.
    Wait,
    /// The situation held still for `stable-after`: act on this decision.
    Decide(Decision),
}

impl Resolver {
    /// A resolver with `settings` that has seen nothing yet, as of `now`.
    pub fn new(settings: SbrSettings, now: Instant) -> Resolver {
        Resolver {
            settings,
            seen: Default::default(),
            orphans: BTreeSet::new(),
            changed_at: now,
            unstable_since: None,
            decided: false,
            open: false,
            unlisted: BTreeSet::new(),
        }
    }

    /// The settings it decides with.
    pub fn settings(&self) -> &SbrSettings {
        &self.settings
    }

    /// Forgets what was seen: a new membership of this node starts a new situation at `now`.
    pub fn restart(&mut self, now: Instant) {
        *self = Resolver::new(self.settings.clone(), now);
    }

    /// Notes that `subjects`, still members, are no longer listed by any row because the
    /// rows that listed them were dropped with their observers, which left the view (they
    /// downed themselves, or were downed here). Their dropping out of the partition at the
    /// next [`Resolver::step`] settles the situation as the observers' going does: nobody
    /// heard them again, so it is no sign that the partition healed. Taken for a change, it
    /// restarted the wait for `stable-after` as one side went member after member, and a
    /// node whose every observer of the other side went before it decided found the
    /// partition whole while the other side's members were still listed in the store: it
    /// closed the situation undecided and stayed up alone.
    pub fn unlisted_by_departures(&mut self, subjects: impl IntoIterator<Item = NodeAddr>) {
        self.unlisted.extend(subjects);
    }

    /// Feeds the partition as seen at `now`; answers a decision at most once per situation.
    /// Members that leave the view (their member leases released or lapsed, or downed
    /// here) only settle the situation: their going starts no new wait for `stable-after`,
    /// else a side whose other side downs itself one node after another would wait on
    /// until `down-all-when-unstable` downed it too; and the situation is still decided
    /// when they leave it whole, else a node whose side went before it (static-quorum and
    /// down-all down both sides) would stay up alone, as a cluster of its own.
    ///
    /// The decision is taken on the situation as it last changed, less the members that
    /// left the view: members no longer listed only because their observers left
    /// ([`Resolver::unlisted_by_departures`]) still count as unreachable. A node whose
    /// side's observers went before it would otherwise count the other side's members they
    /// had listed on its own side, and survive where its side went.
    pub fn step(&mut self, me: &NodeAddr, p: &Partition, now: Instant) -> Step {
        let member = |a: &NodeAddr| p.members.iter().any(|m| m.addr == *a);
        let unlisted = std::mem::take(&mut self.unlisted);
        self.orphans
            .extend(unlisted.into_iter().filter(|a| self.seen.0.contains(a)));
        self.orphans
            .retain(|a| member(a) && !p.unreachable.contains(a) && !p.indirect.contains(a));
        let mut unreachable = p.unreachable.clone();
        unreachable.extend(self.orphans.iter().cloned());
        let seen = (unreachable, p.indirect.clone());
        if seen != self.seen {
            let left = |old: &BTreeSet<NodeAddr>, new: &BTreeSet<NodeAddr>| {
                old.is_superset(new) && old.difference(new).all(|a| !member(a))
            };
            let settled = left(&self.seen.0, &seen.0) && left(&self.seen.1, &seen.1);
            self.seen = seen;
            if !settled {
                self.changed_at = now;
                self.decided = false;
                self.open = !self.seen.0.is_empty() || !self.seen.1.is_empty();
                if self.open {
                    self.unstable_since.get_or_insert(now);
                } else {
                    self.unstable_since = None;
                }
            }
        }
        if !self.open || self.decided {
            return Step::Wait;
        }
        let stable = now.saturating_duration_since(self.changed_at) >= self.settings.stable_after;
        let unstable_too_long = match (self.settings.down_all_when_unstable, self.unstable_since) {
            (Some(extra), Some(since)) => {
                now.saturating_duration_since(since) >= self.settings.stable_after + extra
            }
            _ => false,
        };
        if stable {
            self.decided = true;
            self.unstable_since = None;
            let situation = Partition {
                members: p.members.clone(),
                unreachable: self.seen.0.clone(),
                indirect: self.seen.1.clone(),
            };
            Step::Decide(decide(
                &self.settings.strategy,
                self.settings.role.as_deref(),
                me,
                &situation,
            ))
        } else if unstable_too_long {
            self.decided = true;
            self.unstable_since = None;
            Step::Decide(Decision::DownSelf {
                why: "down-all-when-unstable: reachability kept changing for stable-after + down-all-when-unstable".into(),
            })
        } else {
            Step::Wait
        }
    }
}

#[cfg(test)]
mod tests {
    use super::strategy::tests::{a, part as cut_of};
    use super::*;

    /// A 3-node cluster where each (observer, subject) pair of `cut` cannot hear.
    fn part(cut: &[(u16, u16)]) -> Partition {
        cut_of(3, cut)
    }

    fn settings(extra: &str) -> Result<Option<SbrSettings>, ConfigError> {
        let text = format!(
            "[cluster]\ncookie = \"sbr-test-cookie-0123456789abcdef0\"\n[cluster.split-brain-resolver]\n{extra}"
        );
        let config = tenure_lease::TenureConfig::from_toml_str(&text, "test")?;
        config
            .section::<SbrConfig>("cluster.split-brain-resolver")?
            .resolve()
    }

    #[test]
    fn the_reference_defaults_to_lease_majority() {
        let s = settings("").unwrap().unwrap();
        assert_eq!(s.strategy.name(), "lease-majority");
        assert_eq!(s.when_down, WhenDown::Rejoin);
        assert_eq!(s.down_all_when_unstable, Some(s.stable_after * 3 / 4));
        assert!(settings("active-strategy = \"off\"").unwrap().is_none());
        let q =
            settings("active-strategy = \"static-quorum\"\nstatic-quorum = { quorum-size = 2 }")
                .unwrap()
                .unwrap();
        assert_eq!(q.strategy, Strategy::StaticQuorum { quorum_size: 2 });
        let off = settings("down-all-when-unstable = \"off\"")
            .unwrap()
            .unwrap();
        assert_eq!(off.down_all_when_unstable, None);
        let d = settings("down-all-when-unstable = \"2s\"")
            .unwrap()
            .unwrap();
        assert_eq!(d.down_all_when_unstable, Some(Duration::from_secs(2)));
    }

    #[test]
    fn bad_settings_name_the_key() {
        for (extra, key) in [
            ("active-strategy = \"keep-everyone\"", "active-strategy"),
            (
                "active-strategy = \"static-quorum\"",
                "static-quorum.quorum-size",
            ),
            ("stable-after = \"0s\"", "stable-after"),
            ("when-down = \"sulk\"", "when-down"),
            (
                "down-all-when-unstable = \"sometimes\"",
                "down-all-when-unstable",
            ),
            ("stable-afer = \"1s\"", "stable-afer"),
            ("stable-after = \"1m 3x\"", "stable-after"),
            ("lease-majority = { rol = \"x\" }", "lease-majority.rol"),
            (
                "keep-oldest = { down-if-alon = true }\nactive-strategy = \"keep-oldest\"",
                "keep-oldest.down-if-alon",
            ),
        ] {
            let err = settings(extra).unwrap_err().to_string();
            assert!(
                err.contains(&format!("cluster.split-brain-resolver.{key}")),
                "{extra}: {err}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn decides_once_the_observations_held_still_for_stable_after() {
        let mut s = settings("active-strategy = \"keep-majority\"\nstable-after = \"4s\"\ndown-all-when-unstable = \"off\"")
            .unwrap()
            .unwrap();
        let t0 = Instant::now();
        let mut r = Resolver::new(s.clone(), t0);
        let cut = part(&[(2, 1), (3, 1)]);
        assert_eq!(r.step(&a(2), &cut, t0), Step::Wait);
        assert_eq!(
            r.step(&a(2), &cut, t0 + Duration::from_millis(3999)),
            Step::Wait
        );
        assert_eq!(
            r.step(&a(2), &cut, t0 + Duration::from_secs(4)),
            Step::Decide(Decision::Survive { down: vec![a(1)] })
        );
        assert_eq!(
            r.step(&a(2), &cut, t0 + Duration::from_secs(9)),
            Step::Wait,
            "once"
        );
        // A change restarts the wait.
        let more = part(&[(2, 1), (3, 1), (2, 3)]);
        assert_eq!(
            r.step(&a(2), &more, t0 + Duration::from_secs(10)),
            Step::Wait
        );
        assert!(matches!(
            r.step(&a(2), &more, t0 + Duration::from_secs(14)),
            Step::Decide(_)
        ));
        // A new membership of this node: the same observations are a new situation.
        r.restart(t0 + Duration::from_secs(15));
        assert_eq!(
            r.step(&a(2), &more, t0 + Duration::from_secs(15)),
            Step::Wait
        );
        assert_eq!(
            r.step(&a(2), &more, t0 + Duration::from_millis(18999)),
            Step::Wait
        );
        assert!(matches!(
            r.step(&a(2), &more, t0 + Duration::from_secs(19)),
            Step::Decide(_)
        ));

        // Members of the other side leaving the view settle the situation: no new wait.
        let mut r = Resolver::new(s.clone(), t0);
        let four = cut_of(4, &[(1, 3), (1, 4), (2, 3), (2, 4)]);
        assert_eq!(r.step(&a(1), &four, t0), Step::Wait);
        let mut fewer = cut_of(4, &[(1, 3), (2, 3)]);
        fewer.members = fewer
            .members
            .iter()
            .filter(|m| m.addr != a(4))
            .cloned()
            .collect();
        assert_eq!(
            r.step(&a(1), &fewer, t0 + Duration::from_secs(3)),
            Step::Wait
        );
        assert_eq!(
            r.step(&a(1), &fewer, t0 + Duration::from_secs(4)),
            Step::Decide(Decision::Survive { down: vec![a(3)] }),
            "stable-after counted from the cut, not from the member's leaving"
        );
        let mut gone = cut_of(4, &[]);
        gone.members = gone
            .members
            .iter()
            .filter(|m| m.addr != a(3) && m.addr != a(4))
            .cloned()
            .collect();
        let mut r = Resolver::new(s.clone(), t0);
        assert_eq!(r.step(&a(1), &four, t0), Step::Wait);
        assert_eq!(
            r.step(&a(1), &gone, t0 + Duration::from_secs(2)),
            Step::Wait
        );
        assert_eq!(
            r.step(&a(1), &gone, t0 + Duration::from_secs(4)),
            Step::Decide(Decision::Survive { down: vec![] }),
            "decided though the other side left the view before"
        );
        let back = cut_of(3, &[(1, 3), (2, 3), (3, 2)]);
        assert_eq!(
            r.step(&a(1), &back, t0 + Duration::from_secs(5)),
            Step::Wait,
            "a new observation is a change"
        );

        // The observers that listed the other side go first (their side lost): their rows
        // leave the table with them, and with them every record of the other side, whose
        // members are still listed in the store. No heal: the situation holds, and is
        // decided as it was seen.
        for strategy in [Strategy::KeepMajority, Strategy::DownAll] {
            let mut s = s.clone();
            s.strategy = strategy.clone();
            let mut r = Resolver::new(s, t0);
            let seen = cut_of(4, &[(1, 3), (1, 4), (2, 3)]);
            assert_eq!(r.step(&a(2), &seen, t0), Step::Wait);
            let mut after = cut_of(4, &[(2, 3)]);
            after.members = after
                .members
                .iter()
                .filter(|m| m.addr != a(1))
                .cloned()
                .collect();
            r.unlisted_by_departures([a(4)]);
            assert_eq!(
                r.step(&a(2), &after, t0 + Duration::from_secs(2)),
                Step::Wait
            );
            let mut gone = cut_of(4, &[]);
            gone.members = after.members.clone();
            r.unlisted_by_departures([a(3)]);
            assert_eq!(
                r.step(&a(2), &gone, t0 + Duration::from_secs(3)),
                Step::Wait
            );
            assert!(
                matches!(
                    r.step(&a(2), &gone, t0 + Duration::from_secs(4)),
                    Step::Decide(Decision::DownSelf { .. })
                ),
                "{strategy:?}: decided on what was seen, counting 3 and 4 on the other side"
            );
        }

        // Flapping observations: down-all once unstable for stable-after + 2 s.
        s.down_all_when_unstable = Some(Duration::from_secs(2));
        let mut r = Resolver::new(s, t0);
        let whole = part(&[]);
        let mut t = t0;
        let mut step = Step::Wait;
        for i in 0..10 {
            let p = if i % 2 == 0 { &cut } else { &more };
            step = r.step(&a(2), p, t);
            if step != Step::Wait {
                break;
            }
            t += Duration::from_secs(1);
        }
        assert!(
            matches!(step, Step::Decide(Decision::DownSelf { .. })),
            "{step:?}"
        );
        assert_eq!(t, t0 + Duration::from_secs(6));
        assert_eq!(
            r.step(&a(2), &whole, t),
            Step::Wait,
            "healed: nothing to do"
        );
    }
}
