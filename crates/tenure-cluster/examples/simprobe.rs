//! probe
use std::time::{Duration, Instant};
use tenure_cluster::sbr::StrategyName;
use tenure_cluster::sim::{self, Network, Sim, Timings};
fn main() {
    let n: usize = std::env::args().nth(1).unwrap().parse().unwrap();
    let secs: u64 = std::env::args().nth(2).map(|s| s.parse().unwrap()).unwrap_or(10);
    if secs == 0 {
        let w = Instant::now();
        let r = sim::partition_run(n, n / 2, StrategyName::KeepMajority, 1);
        println!("{r:?} {:.1}", w.elapsed().as_secs_f64());
        return;
    }
    let sbr = sim::strategy_settings(StrategyName::LeaseMajority, n);
    let mut s = Sim::new(n, 1, Timings::default(), Network::default(), sbr);
    for k in 0..secs {
        let w = Instant::now();
        s.run_for(Duration::from_secs(1));
        let c = s.counters().clone();
        println!("t={} wall {:.2}s conv={} rows={} dg={}", k + 1, w.elapsed().as_secs_f64(), s.converged(), c.rows, c.datagrams);
    }
}
