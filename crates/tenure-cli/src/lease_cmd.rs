//! `tenure lease acquire|elect|observe|release|show|list`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tenure::names::store_name;
use tenure::store::bounded;
use tenure::{
    AcquireOptions, AcquireOutcome, AcquireRequest, Acquired, EMERGENCY_PRIORITY, LeaseError,
    LeaseEvent, LeaseEventSink, LeaseProvider, LeaseRecord, LeaseSettings, LeaseStore,
};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::mpsc;

use crate::Target;
use crate::exit::{CliError, Outcome};

/// The section to use: the given one or the config's default.
pub fn section_of(provider: &LeaseProvider, section: Option<&str>) -> Result<String, CliError> {
    match section {
        Some(s) => Ok(s.to_string()),
        None => Ok(provider.config().default_lease_section()?),
    }
}

/// `<hostname>/<pid>`: unique per process on a host.
pub fn default_owner() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    format!("{host}/{}", std::process::id())
}

pub fn owner_of(target: &Target) -> String {
    target.owner.clone().unwrap_or_else(default_owner)
}

fn show_duration(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

/// `tenure lease acquire`'s priority options (Helix-style cooperative preemption).
#[derive(clap::Args, Debug, Clone)]
pub struct PriorityArgs {
    /// Priority of this request and grant (higher wins). A holder of lower priority is
    /// asked to give the lease up (with --hold); equal or higher is not preempted.
    #[arg(long, default_value_t = 0, conflicts_with = "emergency")]
    priority: u64,
    /// How long this holder needs to clean up when preempted: requesters wait at most this
    /// long for it.
    #[arg(long, default_value = "0s", value_parser = tenure::duration::parse)]
    cleanup_timeout: Duration,
    /// How long to wait for a lower-priority holder to give the lease up (default: its
    /// cleanup timeout).
    #[arg(long, value_parser = tenure::duration::parse)]
    waiting_timeout: Option<Duration>,
    /// When the wait ends, refuse the holder's renewals and take the lease once its last
    /// renewal expired (at most one heartbeat-timeout later), instead of giving up.
    #[arg(long)]
    forceful: bool,
    /// Operators only: the maximum priority, taking a lower holder's lease over at once.
    /// The old holder may act until its next renewal: only fencing tokens protect
    /// resources meanwhile.
    #[arg(long)]
    emergency: bool,
}

impl PriorityArgs {
    pub fn options(&self) -> AcquireOptions {
        AcquireOptions::with_priority(if self.emergency {
            EMERGENCY_PRIORITY
        } else {
            self.priority
        })
        .cleanup_timeout(self.cleanup_timeout)
        .waiting_timeout(self.waiting_timeout)
        .forceful(self.forceful)
        .emergency(self.emergency)
    }
}

fn describe(r: &LeaseRecord) -> String {
    let mut s = format!(
        "owner={} token={} expires-in={} renewals={}",
        r.owner,
        r.token,
        show_duration(r.expires_in),
        r.version.saturating_sub(1)
    );
    if let Some(note) = &r.note {
        s.push_str(&format!(" note={note:?}"));
    }
    s.push_str(&format!(" priority={}", r.priority));
    if !r.cleanup_timeout.is_zero() {
        s.push_str(&format!(
            " cleanup-timeout={}",
            show_duration(r.cleanup_timeout)
        ));
    }
    if let Some(q) = &r.request {
        s.push_str(&format!(
            " preemption-requested-by={} requester-priority={}{}",
            q.by,
            q.priority,
            if q.forceful { " forceful" } else { "" }
        ));
        if let Some(note) = &q.note {
            s.push_str(&format!(" requester-note={note:?}"));
        }
    }
    s
}

/// Ctrl-C (SIGINT) and SIGTERM, which end a holding command.
fn stop_signals() -> Result<(Signal, Signal), CliError> {
    let listen = |kind| signal(kind).map_err(|e| CliError::Command(e.to_string()));
    Ok((
        listen(SignalKind::interrupt())?,
        listen(SignalKind::terminate())?,
    ))
}

/// The store of a section, with the section's timing.
struct Opened {
    store: Arc<dyn LeaseStore>,
    section: String,
    settings: LeaseSettings,
}

impl Opened {
    /// One store call on `lease`, bounded by the section's operation timeout.
    async fn call<T>(
        &self,
        lease: &str,
        operation: &'static str,
        call: impl Future<Output = Result<T, tenure::StoreError>>,
    ) -> Result<T, CliError> {
        Ok(bounded(
            lease,
            operation,
            self.settings.lease_operation_timeout,
            call,
        )
        .await?)
    }
}

async fn store_for(provider: &LeaseProvider, section: Option<&str>) -> Result<Opened, CliError> {
    let section = section_of(provider, section)?;
    Ok(Opened {
        store: provider.store(&section).await?,
        settings: provider.section(&section)?.settings,
        section,
    })
}

/// The prefix of the holder instance of a one-shot grant (`tenure lease acquire` without
/// `--hold`): no process renews such a grant, so `lease release` frees it without taking it
/// from a holder that still acts on it.
const ONE_SHOT: &str = "cli-";

/// One attempt with the raw store: the grant is not renewed (no process stays to renew
/// it) and lapses after its ttl unless released.
pub async fn acquire_once(
    provider: &LeaseProvider,
    target: &Target,
    note: Option<String>,
    options: AcquireOptions,
) -> Result<Outcome, CliError> {
    tenure::names::check_lease_name(&target.name)?;
    let opened = store_for(provider, target.section.as_deref()).await?;
    options.validate(&*opened.store)?;
    let owner = owner_of(target);
    let request = AcquireRequest {
        name: store_name(&target.name, &opened.store.name_rules()),
        owner: owner.clone(),
        instance: format!("{ONE_SHOT}{}", std::process::id()),
        ttl: opened.settings.store_ttl(),
        note,
        priority: options.priority,
        cleanup_timeout: options.cleanup_timeout,
        emergency: options.emergency,
    };
    let outcome = opened
        .call(&target.name, "acquire", opened.store.try_acquire(&request))
        .await?;
    match outcome {
        AcquireOutcome::Granted(r) => {
            println!(
                "granted {} to {owner} token={} (not renewed: lapses in {} unless released; use --hold to keep it)",
                target.name,
                r.token,
                show_duration(r.expires_in)
            );
            Ok(Outcome::Success)
        }
        AcquireOutcome::Held(r) => {
            println!("not granted {}: held by {}", target.name, describe(&r));
            if options.outranks(r.priority) {
                println!("(a lower priority: use --hold to ask the holder to give it up)");
            }
            Ok(Outcome::No)
        }
    }
}

/// Waits until granted (asking a lower-priority holder to give it up), renews until
/// Ctrl-C/SIGTERM or until a higher priority asks for it, then releases.
pub async fn hold(
    provider: &LeaseProvider,
    target: &Target,
    note: Option<String>,
    options: AcquireOptions,
) -> Result<Outcome, CliError> {
    let section = section_of(provider, target.section.as_deref())?;
    let owner = owner_of(target);
    let mut spec = provider.spec(&target.name, &section, &owner).await?;
    spec.note = note;
    let spec = spec.with_options(options)?;
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let sink = LeaseEventSink::new(move |event| {
        if let LeaseEvent::PreemptionRequested(_) | LeaseEvent::PreemptionWithdrawn(_) = event {
            let _ = events_tx.send(event);
        }
    });
    let lease = tenure::Lease::start_with_events(spec, sink).await?;
    let (mut interrupt, mut terminate) = stop_signals()?;
    let grant = match lease.acquire().await {
        // Held now: the handle's reentrant wait answers at once with the same grant.
        Ok(Acquired::Granted { .. }) => lease.hold().await?,
        first => {
            match first {
                Ok(Acquired::NotGranted { holder, priority }) => println!(
                    "waiting for {}: held by {} (priority {priority})",
                    target.name,
                    holder.as_deref().unwrap_or("another owner")
                ),
                Err(e @ (LeaseError::CleanupTimedOut { .. } | LeaseError::Overtaken { .. })) => {
                    println!("not granted {}: {e}", target.name);
                    return Ok(Outcome::No);
                }
                Err(e) => println!("waiting for {}: {e}", target.name),
                Ok(Acquired::Granted { .. }) => unreachable!(),
            }
            tokio::select! {
                grant = lease.hold() => grant?,
                _ = interrupt.recv() => { release_held(&lease).await?; return Ok(Outcome::No) }
                _ = terminate.recv() => { release_held(&lease).await?; return Ok(Outcome::No) }
            }
        }
    };
    let token = grant.token();
    let lost = grant.lost();
    tokio::pin!(lost);
    println!(
        "holding {} as {owner} token={token} (renewing every {}; Ctrl-C releases)",
        target.name,
        show_duration(lease.settings().heartbeat_interval)
    );
    loop {
        tokio::select! {
            lost = &mut lost => {
                eprintln!("tenure: lost {} (token {token}): {}", target.name, lost.reason);
                return Ok(Outcome::Lost);
            }
            Some(event) = events.recv() => {
                if let LeaseEvent::PreemptionRequested(p) = event {
                    println!(
                        "preemption of {} requested by {} (priority {}{}){}: nothing to clean up, releasing",
                        target.name,
                        p.by,
                        p.priority,
                        if p.forceful { ", forceful" } else { "" },
                        p.note.map(|n| format!(": {n}")).unwrap_or_default()
                    );
                    release_held(&lease).await?;
                    return Ok(Outcome::Lost);
                }
            }
            _ = interrupt.recv() => return release_held(&lease).await,
            _ = terminate.recv() => return release_held(&lease).await,
        }
    }
}

/// `tenure lease elect`: campaigns with `value`, leads until Ctrl-C/SIGTERM (then resigns)
/// or until the leadership is lost.
pub async fn elect(
    provider: &LeaseProvider,
    target: &Target,
    value: String,
) -> Result<Outcome, CliError> {
    let section = section_of(provider, target.section.as_deref())?;
    let owner = owner_of(target);
    let spec = provider.spec(&target.name, &section, &owner).await?;
    let election = tenure::Election::start(spec).await?;
    let (mut interrupt, mut terminate) = stop_signals()?;
    println!("campaigning for {} as {owner}", target.name);
    let token = tokio::select! {
        token = election.campaign(value.clone()) => token?,
        _ = interrupt.recv() => { election.resign().await?; return Ok(Outcome::No) }
        _ = terminate.recv() => { election.resign().await?; return Ok(Outcome::No) }
    };
    println!(
        "elected {} as {owner} token={token} value={value:?} (Ctrl-C resigns)",
        target.name
    );
    let mut state = election.lease().watch_state();
    loop {
        tokio::select! {
            changed = state.changed() => {
                if changed.is_err() || !election.is_leader() {
                    eprintln!("tenure: lost the leadership of {} (token {token})", target.name);
                    return Ok(Outcome::Lost);
                }
            }
            _ = interrupt.recv() => return resigned(&election).await,
            _ = terminate.recv() => return resigned(&election).await,
        }
    }
}

async fn resigned(election: &tenure::Election) -> Result<Outcome, CliError> {
    if election.resign().await? {
        println!("resigned {}", election.name());
        Ok(Outcome::Success)
    } else {
        println!("{} was no longer led by this process", election.name());
        Ok(Outcome::No)
    }
}

/// `tenure lease observe`: prints the election's leader and each change.
pub async fn observe(
    provider: &LeaseProvider,
    name: &str,
    section: Option<&str>,
    count: Option<usize>,
) -> Result<Outcome, CliError> {
    tenure::names::check_lease_name(name)?;
    let opened = store_for(provider, section).await?;
    let stored = store_name(name, &opened.store.name_rules());
    let mut watch =
        tenure::election::observe(opened.store.clone(), name.into(), stored, opened.settings);
    let (mut interrupt, mut terminate) = stop_signals()?;
    let mut printed = 0;
    loop {
        tokio::select! {
            item = watch.next() => match item {
                Some(Ok(Some(l))) => println!(
                    "leader of {name}: owner={} token={} value={}",
                    l.owner,
                    l.token,
                    l.value.map(|v| format!("{v:?}")).unwrap_or_else(|| "none".into())
                ),
                Some(Ok(None)) => println!("leader of {name}: none"),
                Some(Err(e)) => {
                    eprintln!("tenure: {e}");
                    continue;
                }
                None => return Err(CliError::Command(format!("observing {name} stopped"))),
            },
            _ = interrupt.recv() => return Ok(Outcome::Success),
            _ = terminate.recv() => return Ok(Outcome::Success),
        }
        printed += 1;
        if count.is_some_and(|c| printed >= c) {
            return Ok(Outcome::Success);
        }
    }
}

async fn release_held(lease: &tenure::Lease) -> Result<Outcome, CliError> {
    if lease.release().await? {
        println!("released {}", lease.name());
        Ok(Outcome::Success)
    } else {
        println!("{} was no longer held", lease.name());
        Ok(Outcome::No)
    }
}

/// Releases the grant of `--owner` (whatever its token). A grant renewed by a running
/// holder (anything but a one-shot grant of `lease acquire`) is refused unless `force`:
/// freeing it lets another owner be granted at once while that holder learns of it only at
/// its next renewal and acts on the lease until then.
pub async fn release(
    provider: &LeaseProvider,
    target: &Target,
    force: bool,
) -> Result<Outcome, CliError> {
    tenure::names::check_lease_name(&target.name)?;
    let Some(owner) = target.owner.clone() else {
        return Err(CliError::Command(
            "release needs --owner (the owner the lease was acquired for)".into(),
        ));
    };
    let opened = store_for(provider, target.section.as_deref()).await?;
    let store = &opened.store;
    let name = store_name(&target.name, &store.name_rules());
    match opened.call(&target.name, "read", store.read(&name)).await? {
        Some(r) if r.owner == owner => {
            let renewed = !r.instance.starts_with(ONE_SHOT);
            if renewed && !force {
                println!(
                    "not released {}: held by {} and renewed by its holder (instance {}); freed now, another owner could be granted it at once while that holder acts on it until its next renewal (at most {} away). Stop the holder (it releases when it ends), wait until the grant lapses if the holder is gone (in {}), or pass --force",
                    target.name,
                    describe(&r),
                    r.instance,
                    show_duration(opened.settings.heartbeat_interval),
                    show_duration(r.expires_in)
                );
                return Ok(Outcome::No);
            }
            let released = store.release(&name, &owner, r.token);
            if opened.call(&target.name, "release", released).await? {
                println!("released {} (token {})", target.name, r.token);
                if renewed {
                    eprintln!(
                        "tenure: warning: {} was renewed by its holder (instance {}): until that holder's next renewal (at most {} from now; its local deadline is at most {} away) it may still believe it holds the lease and act on it, while another owner can be granted it at once. Only fencing tokens protect resources meanwhile: a resource that refuses tokens below the newest it has seen refuses that holder's late writes (token {}).",
                        target.name,
                        r.instance,
                        show_duration(opened.settings.heartbeat_interval),
                        show_duration(r.expires_in),
                        r.token
                    );
                }
                Ok(Outcome::Success)
            } else {
                println!("not released {}: no longer held by {owner}", target.name);
                Ok(Outcome::No)
            }
        }
        Some(r) => {
            println!("not released {}: held by {}", target.name, describe(&r));
            Ok(Outcome::No)
        }
        None => {
            println!("not released {}: not held", target.name);
            Ok(Outcome::No)
        }
    }
}

pub async fn show(
    provider: &LeaseProvider,
    name: &str,
    section: Option<&str>,
) -> Result<Outcome, CliError> {
    tenure::names::check_lease_name(name)?;
    let opened = store_for(provider, section).await?;
    let stored = store_name(name, &opened.store.name_rules());
    match opened
        .call(name, "read", opened.store.read(&stored))
        .await?
    {
        Some(r) => {
            println!("{name} {}", describe(&r));
            Ok(Outcome::Success)
        }
        None => {
            println!("{name} free");
            Ok(Outcome::No)
        }
    }
}

pub async fn list(
    provider: &LeaseProvider,
    prefix: &str,
    section: Option<&str>,
) -> Result<Outcome, CliError> {
    let opened = store_for(provider, section).await?;
    let section = &opened.section;
    let records = opened
        .call(prefix, "list", opened.store.list(prefix))
        .await?;
    if records.is_empty() {
        println!("no leases held in section {section} with prefix {prefix:?}");
    }
    for r in &records {
        println!("{} {}", r.name, describe(r));
    }
    Ok(Outcome::Success)
}
