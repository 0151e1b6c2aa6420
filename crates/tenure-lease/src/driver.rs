//! The driver of one lease's [machine]: feeds it inputs one at a time and carries out its
//! effects (store calls, timers, renewals, replies, the watchdog).
//!
//! Both the LeaseActor and the [`Lease`](crate::Lease) handle feed it. The actor feeds
//! what arrives in its mailbox (timer firings, renewal answers, commands of other senders);
//! the handle feeds its own commands (acquire, release) on the caller's task, so that an
//! acquire or a release costs the store call and no hop to the actor's task and back
//! (the thin lease path: on a machine with idle cores each hop wakes a parked thread,
//! about 20 µs). The machine's obligations hold whoever feeds it:
//! - **One input at a time, answers first**: a feed holds the driver's *turn* (a fair async
//!   mutex) from the input until the machine awaits no store call, so a call's answer is
//!   fed before any other command.
//! - **Order of one sender**: commands a handle could not feed at once (a release from a
//!   `Drop`, which cannot await) wait in a queue that every feed drains first, so they are
//!   fed before anything the same handle asks later.
//! - **A cancelled caller cancels nothing**, as when commands were messages: when the
//!   future of a feed is dropped (a caller's timeout) while a store call is in flight, the
//!   call goes on in a spawned task, which feeds its answer and the rest of the turn; when
//!   it is dropped before its command was fed, the command is queued for the actor.
//! - **Nothing after the stop**: once the actor stopped (its graceful release fed, or
//!   abandoned), commands are refused: their callers see the actor stopped.
//! - **Renewals wait for nobody**: a renewal's tick (from the alarms task) and its answer
//!   (from the task awaiting the batcher) are fed at once where they happen, without the
//!   turn and without the actor's mailbox, so that a command whose store call is slow (a
//!   handle's or the actor's, up to `lease-operation-timeout`) delays no renewal. The
//!   machine takes them while it awaits a call, and never issues a call for them.
//! - **Effects in step order**: the effects of a step are carried out under the same lock
//!   as the step ([`SharedBelief::step`]), so steps fed from different tasks never carry
//!   out their effects out of order.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use ractor::ActorRef;
use tokio::sync::{Notify, OwnedMutexGuard};
use tokio::time::Instant;

use crate::actor::{AcquireCaller, LeaseMsg, LeaseSpec, ReleaseCaller};
use crate::alarms::Alarms;
use crate::error::{ConfigError, LeaseError};
use crate::events::SharedBelief;
use crate::machine::{Call, Effect, Input, Outcome};
use crate::renewal::RenewAnswer;
use crate::store::{
    AcquireRequest, HeldLease, PreemptAnswer, PreemptionRequest, PreemptionRequests, bounded,
};
use crate::token::FencingToken;

pub(crate) type MachineInput = Input<AcquireCaller, ReleaseCaller>;
type MachineEffect = Effect<AcquireCaller, ReleaseCaller>;
type CallFuture = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// One lease's driver, shared by its actor and its handles.
pub(crate) struct Driver {
    /// This driver, for the tasks that feed renewals back to it.
    me: Weak<Driver>,
    spec: LeaseSpec,
    /// The note of later acquires (`LeaseSpec::note` at first; `SetNote` changes it).
    note: Mutex<Option<String>>,
    belief: Arc<SharedBelief>,
    /// Prefix of this actor's holder instances (`<base>.<n>`, `n` chosen by the machine): no
    /// other actor, process or node incarnation of the owner shares it, so none of them can
    /// take an unexpired grant of this actor's (the store refuses another instance like
    /// another owner).
    instance_base: String,
    /// The actor, once started: timers and renewal answers come back through its mailbox.
    actor: OnceLock<ActorRef<LeaseMsg>>,
    /// The timers and the watchdog, once the actor started.
    alarms: OnceLock<Alarms>,
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Feeds waiting for the turn: a wait in the store's fair queue gives the turn up for
    /// them rather than hold them back for as long as it waits.
    knocking: AtomicUsize,
    /// Rung when a feed starts waiting for the turn, or the driver is abandoned.
    knock: Notify,
    /// Commands to feed before any later one (see the module docs).
    queued: Mutex<VecDeque<MachineInput>>,
    stopped: AtomicBool,
}

impl Driver {
    pub(crate) fn new(spec: LeaseSpec, belief: Arc<SharedBelief>) -> Arc<Driver> {
        Arc::new_cyclic(|me| Driver {
            me: me.clone(),
            note: Mutex::new(spec.note.clone()),
            spec,
            belief,
            instance_base: new_instance_base(),
            actor: OnceLock::new(),
            turn: Arc::new(tokio::sync::Mutex::new(())),
            knocking: AtomicUsize::new(0),
            knock: Notify::new(),
            queued: Mutex::new(VecDeque::new()),
            stopped: AtomicBool::new(false),
            alarms: OnceLock::new(),
        })
    }

    /// Called once by the actor as it starts, before any feed.
    pub(crate) fn started(&self, actor: ActorRef<LeaseMsg>) {
        let me = self.me.clone();
        let renew_due = move |generation| {
            if let Some(driver) = me.upgrade() {
                driver.renewal(Input::RenewDue { generation });
            }
        };
        let _ = self.alarms.set(Alarms::start(
            self.belief.clone(),
            actor.clone(),
            Box::new(renew_due),
        ));
        let _ = self.actor.set(actor);
    }

    /// Feeds a renewal's tick or answer at once, whoever holds the turn (see the module
    /// docs). The machine issues no store call for these inputs, so nothing is awaited.
    fn renewal(&self, input: MachineInput) {
        self.belief.step(input, |effects| {
            for effect in effects {
                self.carry_out(effect);
            }
        });
    }

    pub(crate) fn spec(&self) -> &LeaseSpec {
        &self.spec
    }

    /// Keeps `note` with later acquires. False: the actor stopped, nothing is kept.
    pub(crate) fn set_note(&self, note: Option<String>) -> bool {
        if self.stopped.load(Ordering::SeqCst) {
            return false;
        }
        *lock(&self.note) = note;
        true
    }

    /// Waits for the turn to feed the machine.
    async fn turn(self: &Arc<Self>) -> Turn {
        let knocking = Knocking::new(self);
        let guard = self.turn.clone().lock_owned().await;
        drop(knocking);
        Turn {
            driver: self.clone(),
            guard: Some(guard),
            call: None,
        }
    }

    /// Feeds the queued commands, then `input`, each until the machine awaits no store call.
    /// A command after the stop is dropped unfed: its caller learns the actor stopped.
    /// Dropped before `input` was fed (its caller gave up), it queues `input` for the actor
    /// to feed: a command once asked is carried out, as when it was a message.
    pub(crate) async fn feed(self: &Arc<Self>, input: MachineInput) {
        let mut unfed = Unfed {
            driver: self,
            input: Some(input),
        };
        let mut turn = self.turn().await;
        turn.drain().await;
        if let Some(input) = unfed.input.take() {
            turn.run(input).await;
        }
    }

    /// Feeds the queued commands.
    pub(crate) async fn feed_queued(self: &Arc<Self>) {
        let mut turn = self.turn().await;
        turn.drain().await;
    }

    /// Queues `input` to be fed before any later command and has the actor feed it (for
    /// callers that cannot await).
    pub(crate) fn enqueue(&self, input: MachineInput) {
        lock(&self.queued).push_back(input);
        if let Some(actor) = self.actor.get() {
            let _ = actor.cast(LeaseMsg::FeedQueued);
        }
    }

    /// The graceful stop: feeds the queued commands and then `release` (the actor's own),
    /// after which every command is refused.
    pub(crate) async fn stop(self: &Arc<Self>, release: MachineInput) {
        let mut turn = self.turn().await;
        turn.drain().await;
        self.stopped.store(true, Ordering::SeqCst);
        turn.step_and_call(release).await;
    }

    /// The actor is gone without a graceful stop (killed, failed), or after it: the
    /// machine gives everything up, timers stop, and the store calls it names are made in
    /// the background.
    pub(crate) fn abandon(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.knock.notify_waiters();
        if let Some(alarms) = self.alarms.get() {
            alarms.stop();
        }
        let effects = self.belief.step(Input::Abandon, |effects| effects);
        lock(&self.queued).clear();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for effect in effects {
            if let Effect::Detach(call) = effect {
                let (spec, base, note) =
                    (self.spec.clone(), self.instance_base.clone(), self.note());
                rt.spawn(async move {
                    let outcome = execute(&spec, &base, note, call).await;
                    if let Outcome::Release(released) = outcome {
                        tracing::info!(lease = %spec.name, ?released, "released after the lease actor was killed");
                    }
                });
            }
        }
    }

    fn note(&self) -> Option<String> {
        lock(&self.note).clone()
    }

    /// The store call of `call`, owned, so that it can go on in a task of its own.
    fn call(self: &Arc<Self>, call: Call) -> CallFuture {
        let driver = self.clone();
        Box::pin(async move {
            let note = driver.note();
            match call {
                Call::WaitInLine { instance } => driver.wait_in_line(instance, note).await,
                call => execute(&driver.spec, &driver.instance_base, note, call).await,
            }
        })
    }

    /// Waits in the store's fair queue as holder instance `instance` until granted, or
    /// until another feed knocks (the turn is needed) or the driver is abandoned: leaving
    /// the line then (the store removes the entry when its future is dropped) keeps a
    /// release or a stop from waiting behind the line. A store without a fair queue
    /// answers at once.
    async fn wait_in_line(&self, instance: u64, note: Option<String>) -> Outcome {
        let Some(queue) = self.spec.store.as_fair_queue() else {
            return Outcome::InLine(Ok(()));
        };
        let request = acquire_request(&self.spec, &self.instance_base, note, instance);
        let knocked = self.knock.notified();
        let mut knocked = std::pin::pin!(knocked);
        knocked.as_mut().enable();
        if self.knocking.load(Ordering::SeqCst) > 0 || self.stopped.load(Ordering::SeqCst) {
            return Outcome::InLine(Ok(()));
        }
        // No bound but the driver's other work: a waiter keeps its place however long the
        // holder keeps the lease.
        let wait = crate::duration::MAX_DURATION;
        tokio::select! {
            answer = queue.acquire_fair(&request, wait) => Outcome::InLine(
                answer.map(|_| ()).map_err(|source| LeaseError::Store {
                    name: self.spec.name.clone(),
                    operation: "acquire",
                    source,
                }),
            ),
            () = knocked => Outcome::InLine(Ok(())),
        }
    }

    /// Carries out the effects of one step but its awaited call, which it returns.
    fn carry_out_all(&self, effects: Vec<MachineEffect>) -> Option<Call> {
        let mut call = None;
        for effect in effects {
            match effect {
                Effect::Call(c) => call = Some(c),
                other => self.carry_out(other),
            }
        }
        call
    }

    fn carry_out(&self, effect: MachineEffect) {
        let Some(alarms) = self.alarms.get() else {
            // Unreachable: nothing is fed before the actor started.
            return;
        };
        match effect {
            // Emitted by the step itself, in order, before any other effect.
            Effect::Emit(_) => {}
            Effect::ReplyAcquire { to, answer } => {
                let _ = to.send(answer);
            }
            Effect::ReplyRelease { to, answer } => match to {
                ReleaseCaller::Port(port) => {
                    let _ = port.send(answer);
                }
                ReleaseCaller::Stop => {
                    if let Err(e) = answer {
                        tracing::warn!(lease = %self.spec.name, error = %e, "release on stop failed; the grant expires after its ttl");
                    }
                }
            },
            Effect::Arm { timer, at } => alarms.arm(timer, self.belief.clock().to_tokio(at)),
            Effect::Disarm(timer) => alarms.disarm(timer),
            Effect::ArmRenewal { generation } => {
                alarms.arm_renewal(generation, self.spec.batcher.next_tick(Instant::now()))
            }
            Effect::DisarmRenewal => alarms.disarm_renewal(),
            Effect::StartWatchdog { generation } => alarms.watch(generation),
            Effect::StopWatchdog => alarms.unwatch(),
            Effect::Renew { generation, token } => {
                let answer = self.spec.batcher.renew(HeldLease {
                    name: self.spec.store_name.clone(),
                    token,
                });
                let me = self.me.clone();
                tokio::spawn(async move {
                    let answer: Option<RenewAnswer> = answer.await.ok();
                    if let Some(driver) = me.upgrade() {
                        driver.renewal(Input::Renewed { generation, answer });
                    }
                });
            }
            Effect::Call(call) | Effect::Detach(call) => {
                // Not reached for `Call` (awaited by the feed); a detached call while the
                // actor lives runs in the background.
                let (spec, base, note) =
                    (self.spec.clone(), self.instance_base.clone(), self.note());
                tokio::spawn(async move {
                    execute(&spec, &base, note, call).await;
                });
            }
        }
    }
}

/// A feed waiting for the driver's turn, counted in `knocking` until it has it.
struct Knocking<'a>(&'a Driver);

impl<'a> Knocking<'a> {
    fn new(driver: &'a Driver) -> Self {
        driver.knocking.fetch_add(1, Ordering::SeqCst);
        driver.knock.notify_waiters();
        Knocking(driver)
    }
}

impl Drop for Knocking<'_> {
    fn drop(&mut self) {
        self.0.knocking.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A command not fed yet; dropped so, it is queued for the actor (see [`Driver::feed`]).
struct Unfed<'a> {
    driver: &'a Arc<Driver>,
    input: Option<MachineInput>,
}

impl Drop for Unfed<'_> {
    fn drop(&mut self) {
        if let Some(input) = self.input.take() {
            self.driver.enqueue(input);
        }
    }
}

/// A feed holding the driver's turn. Dropped while a store call is in flight (its caller
/// gave up), it hands the call and the turn to a spawned task that finishes the feed.
struct Turn {
    driver: Arc<Driver>,
    guard: Option<OwnedMutexGuard<()>>,
    call: Option<CallFuture>,
}

impl Turn {
    async fn drain(&mut self) {
        loop {
            let next = lock(&self.driver.queued).pop_front();
            let Some(input) = next else {
                return;
            };
            self.run(input).await;
        }
    }

    /// Feeds `input` unless the driver stopped (dropped then: a caller learns the actor
    /// stopped).
    async fn run(&mut self, input: MachineInput) {
        if self.driver.stopped.load(Ordering::SeqCst) {
            return;
        }
        self.step_and_call(input).await;
    }

    async fn step_and_call(&mut self, input: MachineInput) {
        let driver = self.driver.clone();
        let mut call = driver
            .belief
            .step(input, |effects| driver.carry_out_all(effects));
        while let Some(next) = call {
            let outcome = self.call.insert(driver.call(next)).await;
            self.call = None;
            call = driver.belief.step(Input::Answered(outcome), |effects| {
                driver.carry_out_all(effects)
            });
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        let (driver, guard) = (self.driver.clone(), self.guard.take());
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // Only while the runtime itself shuts down, when the actor goes with it.
            tracing::warn!(lease = %driver.spec.name, "a lease's store call was cancelled with its runtime");
            return;
        };
        rt.spawn(async move {
            let outcome = call.await;
            let mut turn = Turn {
                driver,
                guard,
                call: None,
            };
            turn.step_and_call(Input::Answered(outcome)).await;
            turn.drain().await;
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Unique per LeaseActor on this host: the prefix of its holder instances.
fn new_instance_base() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{:x}-{nanos:x}-{n:x}", std::process::id())
}

/// Carries out one store call of the machine, bounded by the operation timeout. A blocking
/// store may run it inline on the polling thread (see [`crate::blocking`]).
async fn execute(spec: &LeaseSpec, base: &str, note: Option<String>, call: Call) -> Outcome {
    crate::blocking::allow_inline(execute_call(spec, base, note, call)).await
}

async fn execute_call(spec: &LeaseSpec, base: &str, note: Option<String>, call: Call) -> Outcome {
    match call {
        Call::Acquire { instance } => {
            let request = acquire_request(spec, base, note, instance);
            let answer = bounded(
                &spec.name,
                "acquire",
                spec.settings.lease_operation_timeout,
                spec.store.try_acquire(&request),
            )
            .await;
            Outcome::Acquire(answer)
        }
        Call::WaitInLine { .. } => Outcome::InLine(Ok(())),
        Call::Release { token } => Outcome::Release(release_ours(spec, base, token).await),
        Call::RequestPreemption { token, forceful } => {
            Outcome::Preempt(request_preemption(spec, base, note, token, forceful).await)
        }
        Call::WithdrawPreemption { token } => {
            withdraw_request(spec, token).await;
            Outcome::Withdrawn
        }
    }
}

/// The request of holder instance `instance` (`<base>.<instance>`) with the spec's ttl
/// and options.
fn acquire_request(
    spec: &LeaseSpec,
    base: &str,
    note: Option<String>,
    instance: u64,
) -> AcquireRequest {
    AcquireRequest {
        name: spec.store_name.clone(),
        owner: spec.owner.clone(),
        instance: format!("{base}.{instance}"),
        ttl: spec.settings.store_ttl(),
        note,
        priority: spec.options.priority,
        cleanup_timeout: spec.options.cleanup_timeout,
        emergency: spec.options.emergency,
    }
}

/// Releases this actor's grant: the believed one (`token`), or else whatever grant of one
/// of this actor's instances (`<base>.<n>`) the store holds.
async fn release_ours(
    spec: &LeaseSpec,
    base: &str,
    token: Option<FencingToken>,
) -> Result<bool, LeaseError> {
    if let Some(token) = token {
        return release_in_store(spec, token).await;
    }
    let record = bounded(
        &spec.name,
        "release",
        spec.settings.lease_operation_timeout,
        spec.store.read(&spec.store_name),
    )
    .await?;
    match record {
        Some(r) if r.owner == spec.owner && r.instance.starts_with(&format!("{base}.")) => {
            release_in_store(spec, r.token).await
        }
        _ => Ok(false),
    }
}

async fn release_in_store(spec: &LeaseSpec, token: FencingToken) -> Result<bool, LeaseError> {
    bounded(
        &spec.name,
        "release",
        spec.settings.lease_operation_timeout,
        spec.store.release(&spec.store_name, &spec.owner, token),
    )
    .await
}

async fn request_preemption(
    spec: &LeaseSpec,
    base: &str,
    note: Option<String>,
    token: FencingToken,
    forceful: bool,
) -> Result<PreemptAnswer, LeaseError> {
    let request = PreemptionRequest {
        by: spec.owner.clone(),
        instance: base.to_string(),
        priority: spec.options.priority,
        forceful,
        note,
    };
    bounded(
        &spec.name,
        "request preemption",
        spec.settings.lease_operation_timeout,
        preemption_requests(spec)?.request_preemption(&spec.store_name, token, &request),
    )
    .await
}

/// The store's preemption requests: priorities are refused at start on a store without
/// them ([`AcquireOptions::validate`](crate::AcquireOptions::validate)), and here as well for
/// a spec whose options were set without that check.
fn preemption_requests(spec: &LeaseSpec) -> Result<&dyn PreemptionRequests, LeaseError> {
    spec.store.as_preemption_requests().ok_or_else(|| {
        LeaseError::Config(ConfigError::invalid(
            "priority",
            format!(
                "the {} store does not support priorities and preemption",
                spec.store.kind()
            ),
        ))
    })
}

/// Takes `spec.owner`'s request off grant `token` (best effort: a request left behind ends
/// with the grant).
async fn withdraw_request(spec: &LeaseSpec, token: FencingToken) {
    let withdrawn = match preemption_requests(spec) {
        Ok(requests) => {
            bounded(
                &spec.name,
                "withdraw preemption",
                spec.settings.lease_operation_timeout,
                requests.withdraw_preemption(&spec.store_name, token, &spec.owner),
            )
            .await
        }
        Err(e) => Err(e),
    };
    tracing::info!(lease = %spec.name, token = token.get(), ?withdrawn, "preemption request withdrawn");
}
