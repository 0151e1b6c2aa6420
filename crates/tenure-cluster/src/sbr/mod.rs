//! The split brain resolver: one downing decision per node for the whole cluster (Akka's
//! SBR). Reachability observations travel in heartbeats ([`ReachTable`]); once they have
//! not changed for `stable-after`, each node decides with the configured [`Strategy`]
//! whether its side survives (it downs the other side in its view) or goes (it downs
//! itself: stops what it hosts, releases its leases, and rejoins or exits).
//!
//! Safety never depends on this decision: shards and singletons are guarded by their own
//! leases. The resolver brings availability: the surviving side stops waiting for members
//! it cannot hear, and the losing side gives its leases up instead of renewing them.

mod strategy;
mod table;

use std::collections::BTreeSet;
use std::time::Duration;

use tenure_lease::ConfigError;
use tenure_lease::config::TableReader;
use tokio::time::Instant;

pub use strategy::{Decision, Partition, Strategy, decide};
pub use table::{ReachRow, ReachTable};

use crate::identity::NodeAddr;

/// What a node that downed itself does next (`when-down`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenDown {
    /// Waits until it hears every member again, then joins as a new (youngest) member.
    Rejoin,
    /// Stops the node: [`Node::stopped`](crate::Node::stopped) answers
    /// [`ClusterError::Downed`](crate::ClusterError::Downed).
    Exit,
}

/// `[cluster.split-brain-resolver]` (Akka's setting names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SbrSettings {
    /// `active-strategy` with its own section's options.
    pub strategy: Strategy,
    /// The strategy section's `role`: only members with it are counted ("" = all).
    pub role: String,
    /// `stable-after`: how long the reachability observations must stay unchanged before
    /// deciding.
    pub stable_after: Duration,
    /// `down-all-when-unstable`: when observations keep changing for `stable-after` plus
    /// this, every node downs itself (`None`: off).
    pub down_all_when_unstable: Option<Duration>,
    /// `when-down`.
    pub when_down: WhenDown,
}

const KEYS: [&str; 9] = [
    "active-strategy",
    "stable-after",
    "down-all-when-unstable",
    "when-down",
    "keep-majority",
    "static-quorum",
    "keep-oldest",
    "down-all",
    "lease-majority",
];

impl SbrSettings {
    /// Reads `[cluster.split-brain-resolver]`; `None` when `active-strategy = "off"`.
    /// Errors name the key.
    pub fn from_table(table: &toml::Table) -> Result<Option<SbrSettings>, ConfigError> {
        const AT: &str = "cluster.split-brain-resolver";
        let r = TableReader::new(AT, table);
        r.reject_unknown(&KEYS)?;
        let name = r.string("active-strategy")?;
        if name == "off" {
            return Ok(None);
        }
        let section = |name: &str| -> Result<toml::Table, ConfigError> {
            match table.get(name) {
                None => Ok(toml::Table::new()),
                Some(toml::Value::Table(t)) => Ok(t.clone()),
                Some(_) => Err(ConfigError::invalid(
                    format!("{AT}.{name}"),
                    "must be a table",
                )),
            }
        };
        let options = section(&name)?;
        let key = format!("{AT}.{name}");
        let o = TableReader::new(&key, &options);
        let role = |known: &[&str]| -> Result<String, ConfigError> {
            o.reject_unknown(known)?;
            match options.get("role") {
                None => Ok(String::new()),
                Some(_) => o.string("role"),
            }
        };
        let (strategy, role) = match name.as_str() {
            "keep-majority" => (Strategy::KeepMajority, role(&["role"])?),
            "static-quorum" => {
                let role = role(&["role", "quorum-size"])?;
                let quorum_size = o.count("quorum-size").map_err(|_| {
                    ConfigError::invalid(
                        o.key("quorum-size"),
                        "static-quorum needs a positive quorum-size (more than half of the cluster's size)",
                    )
                })?;
                (Strategy::StaticQuorum { quorum_size }, role)
            }
            "keep-oldest" => {
                let role = role(&["role", "down-if-alone"])?;
                (
                    Strategy::KeepOldest {
                        down_if_alone: o.boolean("down-if-alone")?,
                    },
                    role,
                )
            }
            "down-all" => (Strategy::DownAll, role(&["role"])?),
            "lease-majority" => {
                let role = role(&["role", "acquire-lease-delay-for-minority", "release-after"])?;
                (
                    Strategy::LeaseMajority {
                        acquire_delay_for_minority: o
                            .duration("acquire-lease-delay-for-minority")?,
                        release_after: o.positive_duration("release-after")?,
                    },
                    role,
                )
            }
            other => {
                return Err(ConfigError::invalid(
                    r.key("active-strategy"),
                    format!(
                        "unknown strategy {other:?}: expected keep-majority, lease-majority, static-quorum, keep-oldest, down-all or off"
                    ),
                ));
            }
        };
        let stable_after = r.positive_duration("stable-after")?;
        let down_all_when_unstable = match table.get("down-all-when-unstable") {
            Some(toml::Value::String(s)) if s == "on" => Some(stable_after * 3 / 4),
            Some(toml::Value::String(s)) if s == "off" => None,
            Some(toml::Value::Boolean(b)) => b.then_some(stable_after * 3 / 4),
            _ => Some(r.positive_duration("down-all-when-unstable").map_err(|_| {
                ConfigError::invalid(
                    r.key("down-all-when-unstable"),
                    "expected \"on\", \"off\" or a duration such as \"5s\"",
                )
            })?),
        };
        let when_down = match r.string("when-down")?.as_str() {
            "rejoin" => WhenDown::Rejoin,
            "exit" => WhenDown::Exit,
            other => {
                return Err(ConfigError::invalid(
                    r.key("when-down"),
                    format!("{other:?}: expected \"rejoin\" or \"exit\""),
                ));
            }
        };
        Ok(Some(SbrSettings {
            strategy,
            role,
            stable_after,
            down_all_when_unstable,
            when_down,
        }))
    }
}

/// When to decide: the observations must hold still for `stable-after`; one decision per
/// stable situation.
#[derive(Debug)]
pub struct Resolver {
    settings: SbrSettings,
    seen: (BTreeSet<NodeAddr>, BTreeSet<NodeAddr>),
    changed_at: Instant,
    /// Since when members have been unreachable without a decision.
    unstable_since: Option<Instant>,
    decided: bool,
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
            changed_at: now,
            unstable_since: None,
            decided: false,
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

    /// Feeds the partition as seen at `now`; answers a decision at most once per situation.
    pub fn step(&mut self, me: &NodeAddr, p: &Partition, now: Instant) -> Step {
        let seen = (p.unreachable.clone(), p.indirect.clone());
        if seen != self.seen {
            self.seen = seen;
            self.changed_at = now;
            self.decided = false;
            if p.is_whole() {
                self.unstable_since = None;
            } else {
                self.unstable_since.get_or_insert(now);
            }
        }
        if p.is_whole() || self.decided {
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
            Step::Decide(decide(&self.settings.strategy, &self.settings.role, me, p))
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
        let text = format!("[cluster]\ncookie = \"c\"\n[cluster.split-brain-resolver]\n{extra}");
        let config = tenure_lease::TenureConfig::from_toml_str(&text, "test")?;
        let t = config.table()["cluster"]["split-brain-resolver"]
            .as_table()
            .cloned()
            .unwrap_or_default();
        SbrSettings::from_table(&t)
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
