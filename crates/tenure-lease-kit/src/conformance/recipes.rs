//! The recipes on every store: leader election and the counting semaphore, with a holder
//! cut off from the store among the faults, their histories judged by the one checker.

use std::sync::Arc;
use std::time::Duration;

use tenure_history::Recorder;
use tenure_history::check::check;
use tokio::time::timeout;

use super::{FaultyClient, Harness, test_settings};
use tenure_lease::names::store_name;
use tenure_lease::{
    Election, Leader, LeaderWatch, LeaseError, LeaseObserver, LeaseSpec, LeaseStore, Semaphore,
};

/// Long enough for any wait of these cases (a few ttls); a hang fails the case instead of
/// blocking the suite.
const PATIENCE: Duration = Duration::from_secs(30);

/// The lease events of every candidate or client, as a node's history would hold them:
/// each owner its own node.
#[derive(Clone)]
struct History(Recorder);

impl Default for History {
    fn default() -> Self {
        History(Recorder::new("recipes", "1"))
    }
}

impl History {
    fn observer(&self) -> LeaseObserver {
        let recorder = self.0.clone();
        LeaseObserver::new(move |lease, owner, trace| {
            recorder.record_as(owner, "1", || {
                tenure_lease::history::emit(lease, owner, trace)
            })
        })
    }

    /// Asserts that the checker finds the history safe; returns the number of grants.
    fn assert_safe(&self) -> usize {
        let unknown = self.0.unknown_events();
        assert_eq!(
            unknown.count(),
            0,
            "events no history knows: {:?}",
            unknown.reasons()
        );
        let mut entries = self.0.entries();
        entries.sort_by_key(|e| e.t);
        let verdict = check(&entries);
        assert!(
            verdict.is_safe(),
            "violations: {}",
            verdict
                .violations
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
        verdict.stats.grants
    }
}

fn spec(store: Arc<dyn LeaseStore>, name: &str, owner: &str, rec: &History) -> LeaseSpec {
    LeaseSpec::new(name, owner, store, test_settings())
        .expect("valid spec")
        .with_observer(rec.observer())
}

/// The next leader the watch reports (errors are skipped: the store may blip).
async fn next_leader(watch: &mut LeaderWatch) -> Option<Leader> {
    loop {
        match timeout(PATIENCE, watch.next()).await {
            Ok(Some(Ok(leader))) => return leader,
            Ok(Some(Err(_))) => continue,
            Ok(None) => panic!("the observer ended"),
            Err(_) => panic!("no leader change within {PATIENCE:?}"),
        }
    }
}

/// Reads the watch until it reports a leader matching `wanted`; asserts that every leader
/// reported on the way has a token above the previous one's.
async fn observe_until(
    watch: &mut LeaderWatch,
    seen: &mut Vec<Option<Leader>>,
    wanted: impl Fn(&Option<Leader>) -> bool,
) {
    loop {
        let leader = next_leader(watch).await;
        if let (Some(now), Some(before)) =
            (&leader, seen.iter().rev().flatten().next().map(|l| l.token))
        {
            assert!(
                now.token >= before,
                "observed token {} after {before}",
                now.token
            );
        }
        let done = wanted(&leader);
        seen.push(leader);
        if done {
            return;
        }
    }
}

/// Three candidates: one leads at a time, proclaim changes the value and keeps the token,
/// a non-leader cannot proclaim, a leader cut off from the store loses the leadership
/// before the next is elected, a resignation elects the next at once, and an observer sees
/// each leader with increasing tokens.
pub async fn election_one_leader_at_a_time(h: &dyn Harness) {
    let rec = History::default();
    let observer_store = h.client().await;
    let rules = observer_store.name_rules();
    let mut watch = tenure_lease::election::observe(
        observer_store,
        "elect".into(),
        store_name("elect", &rules),
        test_settings(),
    );
    let mut seen = Vec::new();
    observe_until(&mut watch, &mut seen, Option::is_none).await;

    let cut = FaultyClient::new(h.client().await);
    let a = Election::start(spec(cut.clone(), "elect", "a", &rec))
        .await
        .expect("candidate a");
    let first = a.campaign("a-1").await.expect("a campaigns alone");
    assert!(a.is_leader());
    observe_until(&mut watch, &mut seen, |l| {
        l.as_ref()
            .is_some_and(|l| l.value.as_deref() == Some("a-1"))
    })
    .await;

    let b = Arc::new(
        Election::start(spec(h.client().await, "elect", "b", &rec))
            .await
            .expect("candidate b"),
    );
    let c = Arc::new(
        Election::start(spec(h.client().await, "elect", "c", &rec))
            .await
            .expect("candidate c"),
    );
    let campaigns = [(b.clone(), "b-1"), (c.clone(), "c-1")].map(|(e, v)| {
        tokio::spawn(async move {
            let token = e.campaign(v).await;
            (e, token)
        })
    });

    assert_eq!(a.proclaim("a-2").await.expect("proclaim"), first);
    let leader = b.leader().await.expect("read").expect("a leads");
    assert_eq!(
        (leader.owner.as_str(), leader.value.as_deref(), leader.token),
        ("a", Some("a-2"), first)
    );
    assert!(matches!(
        b.proclaim("b-0").await,
        Err(LeaseError::NotHeld { .. })
    ));
    observe_until(&mut watch, &mut seen, |l| {
        l.as_ref()
            .is_some_and(|l| l.value.as_deref() == Some("a-2"))
    })
    .await;

    // The leader loses the store: the next leader is elected only after a stopped leading.
    cut.set_cut(true);
    let [first_done, second_done] = campaigns;
    let (winner, token) = tokio::select! {
        done = first_done => done.expect("campaign task"),
        done = second_done => done.expect("campaign task"),
    };
    let second = token.expect("the campaign ends with a leadership");
    assert!(second > first, "{second} after {first}");
    assert!(!a.is_leader(), "a no longer believes it leads");
    let other = if Arc::ptr_eq(&winner, &b) { &c } else { &b };
    let next_value = if Arc::ptr_eq(&winner, &b) {
        "c-1"
    } else {
        "b-1"
    };

    // A resignation hands over at once to the last candidate.
    assert!(winner.resign().await.expect("resign"));
    let third = timeout(PATIENCE, async {
        loop {
            if other.is_leader() {
                return other.lease().token().expect("held");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the last candidate is elected");
    assert!(third > second, "{third} after {second}");
    observe_until(&mut watch, &mut seen, |l| {
        l.as_ref()
            .is_some_and(|l| l.value.as_deref() == Some(next_value))
    })
    .await;
    assert!(other.resign().await.expect("resign"));
    observe_until(&mut watch, &mut seen, Option::is_none).await;
    cut.set_cut(false);
    assert!(rec.assert_safe() >= 3, "three leaderships recorded");
}

/// Two permits, four clients: at most two hold at a time, each with its own token; a
/// released permit goes to the next client with a higher token; a holder cut off from the
/// store loses its permit before another client gets it; a client configured with another
/// count is told.
pub async fn semaphore_at_most_n_holders(h: &dyn Harness) {
    let rec = History::default();
    let cut = FaultyClient::new(h.client().await);
    let a = Semaphore::start(spec(h.client().await, "jobs", "a", &rec), 2)
        .await
        .expect("client a");
    let b = Semaphore::start(spec(cut.clone(), "jobs", "b", &rec), 2)
        .await
        .expect("client b");
    let c = Semaphore::start(spec(h.client().await, "jobs", "c", &rec), 2)
        .await
        .expect("client c");
    let pa = a.try_acquire().await.expect("a").expect("a permit for a");
    let pb = b.try_acquire().await.expect("b").expect("a permit for b");
    assert_ne!(pa.slot, pb.slot);
    assert_eq!(c.try_acquire().await.expect("c"), None, "both permits held");
    let mut holders: Vec<String> = c
        .holders()
        .await
        .expect("holders")
        .into_iter()
        .map(|r| r.owner)
        .collect();
    holders.sort();
    assert_eq!(holders, ["a", "b"]);

    assert!(a.release(&pa).await.expect("release"));
    let pc = c
        .try_acquire()
        .await
        .expect("c")
        .expect("the released permit");
    assert_eq!(pc.slot, pa.slot);
    assert!(pc.token > pa.token, "{} after {}", pc.token, pa.token);

    let d = Semaphore::start(spec(h.client().await, "jobs", "d", &rec), 3)
        .await
        .expect("client d");
    let mismatch = d.try_acquire().await;
    assert!(
        matches!(&mismatch, Err(LeaseError::Config(e)) if e.to_string().contains("a semaphore of 2")),
        "{mismatch:?}"
    );

    // b loses the store: a gets b's permit once b's grant lapsed, never while b believes.
    cut.set_cut(true);
    let again = a
        .acquire(PATIENCE)
        .await
        .expect("a")
        .expect("b's permit once it lapsed");
    assert_eq!(again.slot, pb.slot);
    assert!(again.token > pb.token);
    assert!(b.held().is_empty(), "b gave its permit up");
    cut.set_cut(false);
    assert!(a.release(&again).await.expect("release"));
    assert!(c.release(&pc).await.expect("release"));
    assert!(rec.assert_safe() >= 4, "four permits granted");
}
