//! Remembered ids ([`RememberedIds::remember`](tenure_lease::RememberedIds::remember)): written only under the current grant, never
//! expiring, surviving releases, expiries, ended sessions and store restarts, kept apart per
//! lease name, and applied whole however large the change.

use std::time::Duration;

use super::{Harness, granted_token, poll_until_granted, remembered_ids_of, request};
use tenure_lease::{LeaseStore, RememberChange};

/// Ids that are awkward for some store's key or path syntax.
fn awkward_ids() -> Vec<String> {
    [
        "",
        ".",
        "..",
        "a/b",
        "/",
        "%",
        "%2F",
        "id-",
        "with space",
        "ünïcödé ✓",
        "zookeeper",
        "holder",
        "wait-0000000001",
    ]
    .into_iter()
    .map(String::from)
    .chain([
        "x".repeat(300),
        "\u{10FFFF}".into(),
        "\u{7f}".into(),
        "tab\there".into(),
    ])
    .collect()
}

fn ids(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids.dedup();
    ids
}

async fn remembered(store: &dyn LeaseStore, name: &str) -> Vec<String> {
    let got = remembered_ids_of(store)
        .remembered(name)
        .await
        .expect("remembered");
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "{name}: remembered ids not sorted and distinct: {got:?}"
    );
    got
}

/// The remember-entities store of a lease: only the current grant changes the ids, anyone
/// reads them, and they outlive every grant and the store's restarts.
pub async fn remembered_ids(h: &dyn Harness) {
    let a = h.client().await;
    let b = h.client().await;
    let name = "remembered";
    let ttl = Duration::from_secs(2);
    assert_eq!(remembered(&*a, name).await, Vec::<String>::new());
    let t1 = granted_token(
        &a.try_acquire(&request(name, "a", ttl))
            .await
            .expect("acquire"),
    );

    // The holder adds ids (awkward ones too), and another client reads them, sorted.
    let mut expected = sorted(
        awkward_ids()
            .into_iter()
            .chain(ids(&["e1", "e2"]))
            .collect(),
    );
    let change = RememberChange::add(expected.clone());
    assert!(
        remembered_ids_of(&*a)
            .remember(name, "a", t1, &change)
            .await
            .expect("remember")
    );
    assert_eq!(remembered(&*b, name).await, expected);
    // Adding a remembered id and removing an absent one change nothing.
    let again = RememberChange::new(ids(&["e1"]), ids(&["never-there"]));
    assert!(
        remembered_ids_of(&*a)
            .remember(name, "a", t1, &again)
            .await
            .expect("remember")
    );
    assert_eq!(remembered(&*b, name).await, expected);
    // One change adds and removes at once.
    let change = RememberChange::new(ids(&["e3"]), ids(&["e1", "a/b"]));
    assert!(
        remembered_ids_of(&*a)
            .remember(name, "a", t1, &change)
            .await
            .expect("remember")
    );
    expected.retain(|id| id != "e1" && id != "a/b");
    expected.push("e3".into());
    expected.sort();
    assert_eq!(remembered(&*b, name).await, expected);

    // A token that is not the current grant's changes nothing.
    let stale = tenure_lease::FencingToken::new(t1.get().saturating_sub(1));
    let refused = RememberChange::new(ids(&["stale"]), ids(&["e2"]));
    assert!(
        !remembered_ids_of(&*a)
            .remember(name, "a", stale, &refused)
            .await
            .expect("remember")
    );
    assert_eq!(remembered(&*b, name).await, expected);

    // Released: the ids stay, and the released grant writes no more.
    assert!(a.release(name, "a", t1).await.expect("release"));
    assert_eq!(remembered(&*b, name).await, expected);
    assert!(
        !remembered_ids_of(&*a)
            .remember(name, "a", t1, &refused)
            .await
            .expect("remember")
    );
    assert_eq!(remembered(&*b, name).await, expected);

    // The next holder changes them; the former holder's late write is refused.
    let short = Duration::from_millis(800);
    let t2 = granted_token(
        &b.try_acquire(&request(name, "b", short))
            .await
            .expect("acquire"),
    );
    assert!(t2 > t1);
    assert!(
        !remembered_ids_of(&*a)
            .remember(name, "a", t1, &refused)
            .await
            .expect("remember")
    );
    let change = RememberChange::add(ids(&["e4"]));
    assert!(
        remembered_ids_of(&*b)
            .remember(name, "b", t2, &change)
            .await
            .expect("remember")
    );
    expected.push("e4".into());
    expected.sort();
    assert_eq!(remembered(&*a, name).await, expected);

    // b stops renewing: its grant expires and c takes over; the ids stay, b's late write
    // is refused.
    let c = h.client().await;
    let (_, t3) = poll_until_granted(&*c, name, "c", ttl).await;
    assert!(t3 > t2);
    assert_eq!(remembered(&*c, name).await, expected);
    assert!(
        !remembered_ids_of(&*b)
            .remember(name, "b", t2, &refused)
            .await
            .expect("remember")
    );
    assert_eq!(remembered(&*c, name).await, expected);

    // c's sessions end (its process died): its grant ends, the ids stay.
    h.expire_sessions("c").await;
    let d = h.client().await;
    let (_, t4) = poll_until_granted(&*d, name, "d", ttl).await;
    assert!(t4 > t3);
    assert_eq!(remembered(&*d, name).await, expected);
    assert!(d.release(name, "d", t4).await.expect("release"));

    // Other names keep their own ids, also names that extend this one (as the store holds
    // them: names it cannot hold verbatim are sanitised above the SPI).
    for other in ["remembered-2", "remembered/x", "rememberedx", "remembere"] {
        let other = tenure_lease::names::store_name(other, &d.name_rules());
        assert_eq!(
            remembered(&*d, &other).await,
            Vec::<String>::new(),
            "{other}"
        );
    }
    let other = "remembered-2";
    let t = granted_token(
        &d.try_acquire(&request(other, "d", ttl))
            .await
            .expect("acquire"),
    );
    let change = RememberChange::add(ids(&["only-here"]));
    assert!(
        remembered_ids_of(&*d)
            .remember(other, "d", t, &change)
            .await
            .expect("remember")
    );
    assert_eq!(remembered(&*d, other).await, ids(&["only-here"]));
    assert_eq!(remembered(&*d, name).await, expected);

    // A large change is applied whole; so is its undoing.
    let many: Vec<String> = (0..1000).map(|i| format!("entity-{i:04}")).collect();
    assert!(
        remembered_ids_of(&*d)
            .remember(other, "d", t, &RememberChange::add(many.clone()))
            .await
            .expect("remember 1000 ids")
    );
    let got = remembered(&*d, other).await;
    assert_eq!(got.len(), 1001);
    assert!(many.iter().all(|id| got.contains(id)));
    assert!(
        remembered_ids_of(&*d)
            .remember(other, "d", t, &RememberChange::remove(many))
            .await
            .expect("forget 1000 ids")
    );
    assert_eq!(remembered(&*d, other).await, ids(&["only-here"]));
    assert!(d.release(other, "d", t).await.expect("release"));

    // A restarted store still has them all.
    drop((a, b, c, d));
    h.restart().await;
    let e = h.client().await;
    assert_eq!(remembered(&*e, name).await, expected);
    assert_eq!(remembered(&*e, other).await, ids(&["only-here"]));
}
