//! The README's recipes: leader election and a counting semaphore on the embedded store.
//! Run: `cargo run --example recipes`

use std::time::Duration;

use tenure::{Election, Semaphore, TenureConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let provider = tenure::provider(TenureConfig::load(None)?)?;
    let owner = "10.0.0.7:2552";

    // Leader election: one leader at a time; its value and token are kept in the store.
    let spec = provider.spec("report-scheduler", "sqlite", owner).await?;
    let election = Election::start(spec).await?;
    let token = election.campaign("http://10.0.0.7:8080").await?;
    election.proclaim("http://10.0.0.7:8081").await?; // same token, new value
    if let Some(leader) = election.leader().await? {
        println!(
            "{} leads with token {token}: {:?}",
            leader.owner, leader.value
        );
    }
    let mut leaders = election.observe(); // the current leader, then each change
    println!("observed: {:?}", leaders.next().await);
    election.resign().await?; // the next candidate is elected at once

    // A counting semaphore: at most 3 holders at a time, each with its own token.
    let spec = provider.spec("db-migrations", "sqlite", owner).await?;
    let semaphore = Semaphore::start(spec, 3).await?;
    if let Some(permit) = semaphore.acquire(Duration::from_secs(10)).await? {
        println!("permit {} of 3, token {}", permit.slot, permit.token);
        semaphore.release(&permit).await?;
    }
    Ok(())
}
