//! The demo's scenario: a list of timed faults, read from TOML or built in, and the seeded
//! random choices (timing jitter, targets) that make a run replayable.
//!
//! A scenario file is a list of `[[step]]` tables:
//!
//! ```toml
//! [[step]]
//! at = "10s"        # offset from the start of the traffic
//! fault = "kill"    # kill | pause | cut | isolate | leave | restart | rolling-restart
//! node = 1          # optional: the node (0-based); default a random running node
//! [[step]]
//! at = "20s"
//! fault = "pause"   # SIGSTOP, then SIGCONT after `for`
//! for = "6s"
//! [[step]]
//! at = "30s"
//! fault = "cut"     # stall the traffic between `node` and `peer`, healed after `for`
//! for = "6s"
//! [[step]]
//! at = "40s"
//! fault = "isolate" # stall the traffic between `node` and every other node (default: the
//! for = "6s"        # oldest serving node, which hosts the singleton), healed after `for`
//! ```
//!
//! `restart` without `node` restarts the node that has been down longest.
//! `config/demo-scenario.example.toml` is the built-in scenario written out.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// What a step does to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fault {
    /// SIGKILL.
    Kill,
    /// SIGSTOP, SIGCONT after the step's `for`.
    Pause,
    /// Traffic between `node` and `peer` stalled (both directions), healed after `for`.
    Cut,
    /// Traffic between `node` (default: the oldest serving node) and every other node
    /// stalled, healed after `for`; both sides still reach the store.
    Isolate,
    /// SIGTERM: the node leaves gracefully.
    Leave,
    /// Start a stopped node again (a new incarnation).
    Restart,
    /// Every node in turn: SIGTERM, then started again once it exited.
    #[serde(rename = "rolling-restart")]
    RollingRestart,
}

impl Fault {
    /// How the progress display and the summary name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Kill => "SIGKILL",
            Fault::Pause => "SIGSTOP",
            Fault::Cut => "link cut",
            Fault::Isolate => "isolation",
            Fault::Leave => "graceful leave",
            Fault::Restart => "restart",
            Fault::RollingRestart => "rolling restart",
        }
    }
}

/// One timed fault.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// Offset from the start of the traffic.
    #[serde(deserialize_with = "tenure::duration::serde::required")]
    pub at: Duration,
    /// The fault to inject.
    pub fault: Fault,
    /// The target (0-based node index); a seeded random choice when absent.
    #[serde(default)]
    pub node: Option<usize>,
    /// The other side of a `cut`; a seeded random choice when absent.
    #[serde(default)]
    pub peer: Option<usize>,
    /// How long a `pause` or a `cut` lasts.
    #[serde(
        default,
        rename = "for",
        deserialize_with = "tenure::duration::serde::optional"
    )]
    pub lasts: Option<Duration>,
}

/// The steps of a run, in time order.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// The steps (`[[step]]` tables), in time order.
    #[serde(rename = "step", default)]
    pub steps: Vec<Step>,
}

/// A scenario file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file cannot be read.
    #[error("scenario {path}: {source}")]
    Read {
        /// The scenario file's path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid scenario (TOML or its fields).
    #[error("scenario {path}: {source}")]
    Parse {
        /// The scenario file's path.
        path: String,
        /// The parser's error.
        source: toml::de::Error,
    },
    /// A step cannot be carried out as written.
    #[error("scenario {path}: step {step} ({fault}): {problem}")]
    Step {
        /// The scenario file's path.
        path: String,
        /// The step's number (1-based).
        step: usize,
        /// The step's fault.
        fault: &'static str,
        /// What is wrong with it.
        problem: String,
    },
}

impl Scenario {
    /// Reads and validates a scenario file for a cluster of `nodes` nodes.
    pub fn load(path: &Path, nodes: usize) -> Result<Scenario, ScenarioError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: name.clone(),
            source,
        })?;
        let mut scenario: Scenario =
            toml::from_str(&text).map_err(|source| ScenarioError::Parse {
                path: name.clone(),
                source,
            })?;
        scenario.validate(&name, nodes)?;
        scenario.steps.sort_by_key(|s| s.at);
        Ok(scenario)
    }

    fn validate(&self, path: &str, nodes: usize) -> Result<(), ScenarioError> {
        for (i, step) in self.steps.iter().enumerate() {
            let bad = |problem: String| ScenarioError::Step {
                path: path.to_string(),
                step: i + 1,
                fault: step.fault.as_str(),
                problem,
            };
            for (key, n) in [("node", step.node), ("peer", step.peer)] {
                if let Some(n) = n.filter(|n| *n >= nodes) {
                    return Err(bad(format!(
                        "{key} = {n}, but the cluster has {nodes} nodes"
                    )));
                }
            }
            match step.fault {
                Fault::Pause | Fault::Cut | Fault::Isolate if step.lasts.is_none() => {
                    return Err(bad("needs `for` (how long it lasts)".into()));
                }
                Fault::Cut if step.node.is_some() && step.node == step.peer => {
                    return Err(bad("node and peer are the same node".into()));
                }
                Fault::Kill | Fault::Leave | Fault::Restart | Fault::RollingRestart
                    if step.lasts.is_some() =>
                {
                    return Err(bad("`for` applies to pause, cut and isolate only".into()));
                }
                Fault::RollingRestart if step.node.is_some() || step.peer.is_some() => {
                    return Err(bad("it restarts every node: no `node` or `peer`".into()));
                }
                Fault::Cut | Fault::Isolate if nodes < 2 => {
                    return Err(bad("needs two nodes".into()));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The built-in scenario over `duration` of traffic: steady traffic, SIGKILL of a node
    /// at 15 %, its restart at 30 %, SIGSTOP of a node for twice the `ttl` at 40 %, the
    /// traffic between two nodes cut for twice the `ttl` at 55 %, the oldest node isolated
    /// from the others for twice the `ttl` at 67 %, a graceful leave at 75 %, its restart at
    /// 82 % and a rolling restart of every node at 90 % (which runs to its end, past
    /// `duration`).
    pub fn builtin(duration: Duration, ttl: Duration) -> Scenario {
        let at = |percent: u32| duration * percent / 100;
        let step = |percent, fault, lasts| Step {
            at: at(percent),
            fault,
            node: None,
            peer: None,
            lasts,
        };
        Scenario {
            steps: vec![
                step(15, Fault::Kill, None),
                step(30, Fault::Restart, None),
                step(40, Fault::Pause, Some(ttl * 2)),
                step(55, Fault::Cut, Some(ttl * 2)),
                step(67, Fault::Isolate, Some(ttl * 2)),
                step(75, Fault::Leave, None),
                step(82, Fault::Restart, None),
                step(90, Fault::RollingRestart, None),
            ],
        }
    }

    /// Shifts every step by a seeded offset in `[-jitter, +jitter]` (never before 0), keeping
    /// the steps' order.
    pub fn jittered(mut self, rng: &mut SplitMix, jitter: Duration) -> Scenario {
        let span = jitter.as_millis() as u64 * 2 + 1;
        for step in &mut self.steps {
            let offset = rng.below(span);
            let shifted = step.at.as_millis() as u64 + offset;
            step.at = Duration::from_millis(shifted.saturating_sub(jitter.as_millis() as u64));
        }
        // Jitter never reorders steps (a restart before its kill would be skipped).
        for i in 1..self.steps.len() {
            if self.steps[i].at < self.steps[i - 1].at {
                self.steps[i].at = self.steps[i - 1].at;
            }
        }
        self
    }
}

/// SplitMix64: a small, fast, seedable generator; enough to pick fault times and targets
/// reproducibly from `--seed`.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> SplitMix {
        SplitMix(seed)
    }

    /// The next number of the sequence.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A random element of `items`, if any.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        (!items.is_empty()).then(|| items[self.below(items.len() as u64) as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, nodes: usize) -> Result<Scenario, ScenarioError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        std::fs::write(&path, text).unwrap();
        Scenario::load(&path, nodes)
    }

    #[test]
    fn a_scenario_file_reads_in_time_order() {
        let s = parse(
            "[[step]]\nat = \"9s\"\nfault = \"restart\"\n\
             [[step]]\nat = \"2s\"\nfault = \"pause\"\nnode = 2\nfor = \"4s\"\n",
            3,
        )
        .unwrap();
        assert_eq!(s.steps.len(), 2);
        assert_eq!(s.steps[0].fault, Fault::Pause);
        assert_eq!(s.steps[0].node, Some(2));
        assert_eq!(s.steps[0].lasts, Some(Duration::from_secs(4)));
        assert_eq!(s.steps[1].at, Duration::from_secs(9));
        let roll = parse("[[step]]\nat = \"5s\"\nfault = \"rolling-restart\"\n", 3).unwrap();
        assert_eq!(roll.steps[0].fault, Fault::RollingRestart);
    }

    #[test]
    fn the_example_file_is_the_builtin_scenario() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/demo-scenario.example.toml");
        let file = Scenario::load(&path, 3).unwrap();
        let builtin = Scenario::builtin(Duration::from_secs(60), Duration::from_secs(3));
        assert_eq!(file, builtin);
    }

    #[test]
    fn bad_steps_are_refused_naming_the_step() {
        let no_for = parse("[[step]]\nat = \"1s\"\nfault = \"cut\"\n", 3).unwrap_err();
        assert!(no_for.to_string().contains("step 1 (link cut)"), "{no_for}");
        let out_of_range =
            parse("[[step]]\nat = \"1s\"\nfault = \"kill\"\nnode = 3\n", 3).unwrap_err();
        assert!(
            out_of_range.to_string().contains("node = 3"),
            "{out_of_range}"
        );
        let unknown = parse("[[step]]\nat = \"1s\"\nfault = \"melt\"\n", 3).unwrap_err();
        assert!(unknown.to_string().contains("melt"), "{unknown}");
        let typo = parse("[[step]]\nat = \"1s\"\nfualt = \"kill\"\n", 3).unwrap_err();
        assert!(typo.to_string().contains("fualt"), "{typo}");
        let duration = parse("[[step]]\nat = \"1m 5x\"\nfault = \"kill\"\n", 3).unwrap_err();
        assert!(duration.to_string().contains("1m 5x"), "{duration}");
        let roll_node = parse(
            "[[step]]\nat = \"1s\"\nfault = \"rolling-restart\"\nnode = 1\n",
            3,
        )
        .unwrap_err();
        assert!(
            roll_node.to_string().contains("step 1 (rolling restart)"),
            "{roll_node}"
        );
    }

    #[test]
    fn jitter_is_replayable_and_keeps_the_order() {
        let base = Scenario::builtin(Duration::from_secs(60), Duration::from_secs(3));
        let a = base
            .clone()
            .jittered(&mut SplitMix::new(7), Duration::from_secs(2));
        let b = base
            .clone()
            .jittered(&mut SplitMix::new(7), Duration::from_secs(2));
        assert_eq!(a, b);
        assert!(a.steps.windows(2).all(|w| w[0].at <= w[1].at));
        assert!(
            a.steps
                .iter()
                .zip(&base.steps)
                .all(|(j, s)| j.at.abs_diff(s.at) <= Duration::from_secs(2))
        );
    }
}
