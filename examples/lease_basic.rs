//! The README example: hold a lease, fence a write with its token, release it.
//! Run: `cargo run --example lease_basic`

use tenure::{Acquired, FenceCheck, TenureConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Reference defaults (SQLite file in the state directory, e.g.
    // ~/.local/state/tenure/leases.sqlite), overridden by TENURE_* variables.
    let provider = tenure::provider(TenureConfig::load(None)?)?;
    let lease = provider
        .lease("nightly-report", "sqlite", "10.0.0.7:2552")
        .await?;
    let ledger = FenceCheck::new(); // in-memory: a service receiving the holder's writes
    match lease
        .acquire_with_lost(|lost| eprintln!("lost {}: {}", lost.name, lost.reason))
        .await?
    {
        Acquired::Granted { token } => {
            // Renewed in the background every heartbeat-interval while we work.
            ledger.admit("report.csv", token)?; // the resource refuses older tokens
            println!(
                "holding {} with token {token}: {}",
                lease.name(),
                lease.check_lease()
            );
            assert!(lease.release().await?);
        }
        Acquired::NotGranted { holder, .. } => println!("busy, held by {holder:?}"),
    }
    Ok(())
}
