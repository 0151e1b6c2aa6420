//! The journal conformance kit against the SQLite journal: in the lease file itself, and
//! in a file of its own beside it. Every client (lease store and journal) opens the files
//! anew, as another process would.

use std::time::Duration;

use tenure_journal::conformance::JournalHarness;
use tenure_store_sqlite::conformance::JournalFiles;

mod in_the_lease_file {
    tenure_journal::journal_conformance_tests!(async { super::JournalFiles::new(false) });
}

mod in_its_own_file {
    tenure_journal::journal_conformance_tests!(async { super::JournalFiles::new(true) });
}

/// A lease file deleted while the journal has it open fences nothing: the journal notices
/// the path names another file and checks the fence there, where the lost grant is not.
#[tokio::test]
async fn a_lost_lease_file_fences_nothing() {
    use tenure_journal::{Append, Fence, Refusal, Written};
    use tenure_lease::{AcquireOutcome, AcquireRequest};

    let files = JournalFiles::new(true);
    let journal = files.journal().await;
    let leases = files.leases().await;
    let req = AcquireRequest {
        name: "shard-1".into(),
        owner: "node-a".into(),
        instance: "node-a-1".into(),
        ttl: Duration::from_secs(60),
        ..AcquireRequest::default()
    };
    let AcquireOutcome::Granted(grant) = leases.try_acquire(&req).await.expect("acquire") else {
        panic!("not granted")
    };
    let fence = Fence::new("shard-1", "node-a", grant.token);
    let append = |seq: u64| Append {
        persistence_id: "cart|alice".into(),
        first_seq: seq,
        events: vec![b"added".to_vec()],
        fence: fence.clone(),
    };
    assert_eq!(
        journal.append(append(1)).await.expect("append"),
        Written::Appended(1..=1)
    );
    drop(leases);
    for suffix in ["-wal", "-shm", ""] {
        let mut name = files.leases.as_os_str().to_os_string();
        name.push(suffix);
        let _ = std::fs::remove_file(name);
    }
    assert_eq!(
        journal.append(append(2)).await.expect("append"),
        Written::Refused(Refusal::not_held("cart|alice", &fence)),
        "the grant went with the lost file"
    );
}
