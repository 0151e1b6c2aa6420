//! `tenure check HISTORY`.

use std::path::Path;

use std::time::Duration;

use tenure_cli::check::{self as checker, ActionRule, Verdict, read_history};

use crate::exit::Outcome;

/// Checks the history at `path` (and the acknowledged increments against the sharded
/// counter in `counter`, and the durable entities' journal `(spec, schema)`, when given),
/// prints the verdict, and maps it to an exit code.
pub fn check(
    path: &Path,
    all: bool,
    counter: Option<&Path>,
    journal: Option<(&str, &str)>,
    resume_grace: Duration,
) -> Outcome {
    let events = match read_history(path) {
        Ok(events) => events,
        Err(e) => {
            eprintln!("tenure: error: {e}");
            return Outcome::Error;
        }
    };
    let mut verdict = checker::check_with(&events, ActionRule { resume_grace });
    print_summary(path, &verdict);
    if let Some(file) = counter {
        let acks = match checker::check_counter_acks(&events, file) {
            Ok(acks) => acks,
            Err(e) => {
                eprintln!("tenure: error: {e}");
                return Outcome::Error;
            }
        };
        println!(
            "{}: {} acknowledged increments checked against the counter",
            file.display(),
            acks.acked
        );
        verdict.violations.extend(acks.violations);
    }
    if let Some((spec, schema)) = journal {
        let found = match checker::check_counter_journal(&events, spec, schema) {
            Ok(found) => found,
            Err(e) => {
                eprintln!("tenure: error: {e}");
                return Outcome::Error;
            }
        };
        println!(
            "{spec}: {} events of {} persistence ids, {} appends and {} refusals recorded, \
             {} recoveries ({} states replayed), {} acknowledgements checked against the journal",
            found.events,
            found.persistence_ids,
            found.appends,
            found.refused,
            found.recoveries,
            found.states_compared,
            found.acked
        );
        verdict.violations.extend(found.violations);
        verdict.violations.sort_by_key(|v| v.second.t);
    }
    if verdict.is_safe() {
        println!("verdict: SAFE (no violation)");
        return Outcome::Success;
    }
    let shown = if all { verdict.violations.len() } else { 1 };
    for v in verdict.violations.iter().take(shown) {
        println!("VIOLATION {v}");
    }
    println!(
        "verdict: UNSAFE ({} violation{})",
        verdict.violations.len(),
        if verdict.violations.len() == 1 {
            ""
        } else {
            "s"
        }
    );
    Outcome::No
}

fn print_summary(path: &Path, v: &Verdict) {
    let s = &v.stats;
    println!(
        "{}: {} events, {} leases, {} grants, {} losses, {} releases, {} unknown outcomes, \
         {} writes accepted, {} rejected, {} faults, {} actions checked, {} processes aborted",
        path.display(),
        s.events,
        s.leases,
        s.grants,
        s.losses,
        s.releases,
        s.unknown,
        s.writes_accepted,
        s.writes_rejected,
        s.faults,
        s.actions,
        s.aborts
    );
}
