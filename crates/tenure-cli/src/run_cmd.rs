//! `tenure lease run NAME -- COMMAND`: run a command only while holding a lease.
//!
//! The command is every process it starts ([`tree`]): when its first process exits, when
//! the lease is lost or preempted, or when `tenure` is asked to stop, all of them are ended
//! (SIGTERM, then SIGKILL after `--grace`), and the lease is released only once none is
//! left. `--let-children-outlive-lease` releases when the first process exits instead,
//! leaving the rest running unguarded.
//!
//! Timing: the lease's stop budget is `grace + KILL_SLACK`: the LeaseActor declares the loss
//! that much earlier than the section's own local deadline, so that after SIGTERM, the grace
//! period and SIGKILL, the command is gone before the local deadline, which itself comes
//! before the store can grant the lease to anyone else.

mod tree;

use std::time::Duration;

use tenure::{AcquireOptions, Lease, LeaseEvent, LeaseEventSink, LeaseProvider, StopBudget};
use tenure_cli::history;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::Target;
use crate::exit::{CliError, Outcome};
use crate::lease_cmd::{owner_of, section_of};
use tree::CommandTree;

/// Time allowed for SIGKILL to take effect and the exit to be reaped.
const KILL_SLACK: Duration = Duration::from_millis(200);

/// How often, while the command runs, its processes that exited after being left to
/// `tenure` are reaped.
const REAP_INTERVAL: Duration = Duration::from_secs(1);

/// How `lease run` guards its command.
#[derive(Debug, Clone)]
pub struct Guard {
    /// Time the command gets between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Priority and preemption options of the acquire.
    pub options: AcquireOptions,
    /// Release as soon as the command's first process exits, leaving the processes it
    /// started running, unguarded (the old `lease run`): they may still run while another
    /// holder is granted the lease.
    pub let_children_outlive_lease: bool,
}

pub async fn run(
    provider: &LeaseProvider,
    target: &Target,
    guard: Guard,
    command: &[String],
) -> Result<Outcome, CliError> {
    let Guard {
        grace,
        mut options,
        let_children_outlive_lease,
    } = guard;
    let section = section_of(provider, target.section.as_deref())?;
    let owner = owner_of(target);
    let settings = provider.section(&section)?.settings;
    // The loss reaches this task through a channel, at once: no delivery slack.
    let budget = StopBudget {
        stop_timeout: grace,
        kill_wait: KILL_SLACK,
        // `lease run` does not end itself when the command outlives SIGKILL.
        exit_wait: Duration::ZERO,
        delivery_slack: Duration::ZERO,
    };
    // Its own timing, so its own renewal batcher rather than the section's shared one.
    let store = provider.store(&section).await?;
    if options.cleanup_timeout.is_zero() {
        // Stopping the command is this holder's cleanup; it learns of a request at its
        // next renewal.
        options.cleanup_timeout = settings.heartbeat_interval + grace + KILL_SLACK;
    }
    let spec = tenure::LeaseSpec::new(&target.name, &owner, store, settings)?
        .with_checked_stop_budget(&budget, &format!("lease.{section}"), "--grace")
        .map_err(|e| {
            CliError::Command(format!(
                "--grace {}: too long for this lease section: {e}",
                humantime::format_duration(grace)
            ))
        })?
        .with_note(format!("tenure lease run {}", command.join(" ")))
        .with_options(options)?;
    let (preempt_tx, mut preempt_rx) = mpsc::unbounded_channel();
    let sink = LeaseEventSink::new(move |event| {
        if let LeaseEvent::PreemptionRequested(p) = event {
            let _ = preempt_tx.send(p);
        }
    });
    let lease = Lease::start_with_events(spec, sink).await?;

    let mut interrupt = signal(SignalKind::interrupt()).map_err(io_err)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(io_err)?;
    let grant = tokio::select! {
        grant = lease.hold() => grant?,
        _ = interrupt.recv() => return release_on_exit(&lease, Outcome::No).await,
        _ = terminate.recv() => return release_on_exit(&lease, Outcome::No).await,
    };
    let token = grant.token();
    let lost = grant.lost();
    tokio::pin!(lost);
    tracing::info!(lease = %target.name, token = token.get(), "granted; starting command");
    let mut child = match CommandTree::spawn(command, &target.name, token) {
        Ok(child) => child,
        Err(e) => {
            release_on_exit(&lease, Outcome::Error).await?;
            return Err(e);
        }
    };
    // The command's life in the history: inside the hold of its token, or the checker says.
    history::command_started(&target.name, token, child.pid());
    let stopped = |why: &str| history::command_stopped(&target.name, token, why);

    // Processes the command left to `tenure` that exited are reaped now and then, so that a
    // long run collects no zombies.
    let mut reap = tokio::time::interval(REAP_INTERVAL);
    reap.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let outcome = loop {
        tokio::select! {
            status = child.leader_exited() => {
                let status = status.map_err(io_err)?;
                let left = child.running();
                if !left.is_empty() {
                    if let_children_outlive_lease {
                        eprintln!(
                            "tenure: {} exited, leaving processes {left:?} running unguarded (--let-children-outlive-lease); releasing {}",
                            command[0], target.name
                        );
                    } else {
                        eprintln!(
                            "tenure: {} exited, leaving processes {left:?}; ending them before releasing {}",
                            command[0], target.name
                        );
                        child.end(grace, KILL_SLACK).await;
                    }
                }
                stopped("exited");
                break exit_status(status);
            }
            lost = &mut lost => {
                eprintln!("tenure: lost {} (token {token}): {}; stopping the command", target.name, lost.reason);
                child.end(grace, KILL_SLACK).await;
                stopped("lost");
                return Ok(Outcome::Lost);
            }
            Some(p) = preempt_rx.recv() => {
                eprintln!(
                    "tenure: {} (token {token}) requested by {} (priority {}); stopping the command, then releasing",
                    target.name, p.by, p.priority
                );
                child.end(grace, KILL_SLACK).await;
                stopped("preempted");
                return release_on_exit(&lease, Outcome::Lost).await;
            }
            _ = interrupt.recv() => { child.end(grace, KILL_SLACK).await; stopped("interrupted"); break Outcome::Child(130); }
            _ = terminate.recv() => { child.end(grace, KILL_SLACK).await; stopped("terminated"); break Outcome::Child(143); }
            _ = reap.tick() => child.reap_exited(),
        }
    };
    release_on_exit(&lease, outcome).await
}

/// Releases before the process exits (the runtime would otherwise end before the lease
/// actor's own release on stop ran).
async fn release_on_exit(lease: &Lease, outcome: Outcome) -> Result<Outcome, CliError> {
    if let Err(e) = lease.release().await {
        eprintln!(
            "tenure: release of {} failed (it lapses after its ttl): {e}",
            lease.name()
        );
    }
    Ok(outcome)
}

fn io_err(e: std::io::Error) -> CliError {
    CliError::Command(e.to_string())
}

fn exit_status(status: std::process::ExitStatus) -> Outcome {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => Outcome::Child(u8::try_from(code).unwrap_or(1)),
        (None, Some(sig)) => Outcome::Child(u8::try_from(128 + sig).unwrap_or(255)),
        _ => Outcome::Error,
    }
}
