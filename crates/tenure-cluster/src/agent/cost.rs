//! What heartbeats cost a node per `peer-heartbeat-interval`, counted from the code the agent
//! sends them with ([`crate::ring`], [`crate::sbr::Spread`], [`crate::detector::Monitor`],
//! the datagram codec), for clusters of 6, 12 and 48 idle members; and what the all-to-all
//! scheme (every peer, twice, the whole table and every peer heard) cost, for comparison.
//! `cargo test -p tenure-cluster --all-features --lib -- cost --nocapture` prints the
//! figures (docs/benchmarks.md).

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::detector::Monitor;
use crate::identity::{Incarnation, NodeAddr};
use crate::protocol::Heartbeat;
use crate::sbr::{Carrier, Life, ReachRow, ReachTable};
use crate::transport::datagram::{self, DatagramKey, SessionSecret};

const INTERVAL: Duration = Duration::from_millis(500);
const UNREACHABLE_AFTER: Duration = Duration::from_secs(3);
const SYNC: Duration = Duration::from_secs(5);
const K: usize = 9;
/// Rounds counted: a minute of heartbeats, after a warm-up minute.
const ROUNDS: u32 = 120;

/// Messages and bytes one node sends per heartbeat interval, averaged over [`ROUNDS`].
#[derive(Debug, Clone, Copy)]
struct Cost {
    datagrams: f64,
    datagram_bytes: f64,
    session_copies: f64,
    session_bytes: f64,
}

impl Cost {
    fn messages(&self) -> f64 {
        self.datagrams + self.session_copies
    }
    fn bytes(&self) -> f64 {
        self.datagram_bytes + self.session_bytes
    }
}

fn addr(i: usize) -> NodeAddr {
    NodeAddr::parse("t", &format!("10.0.{}.{}:2552", i / 200, i % 200 + 10)).unwrap()
}

fn life(i: usize) -> Incarnation {
    Incarnation(0x5eed_0000_0000 + i as u64 * 7919)
}

/// The table every idle member holds: each member's own row, empty.
fn idle_table(n: usize, me: &NodeAddr) -> ReachTable {
    let mut t = ReachTable::default();
    for i in 0..n {
        let row = ReachRow {
            observer: addr(i),
            incarnation: life(i),
            version: 1_000 + i as u64,
            unreachable: Vec::new(),
        };
        if row.observer == *me {
            t.set_own(me, life(i), Default::default(), row.version);
        } else {
            let observer = row.observer.clone();
            t.merge(
                me,
                Carrier {
                    node: &observer,
                    seq: 1_000_000,
                },
                vec![row],
                |a| {
                    Some(Life {
                        incarnation: life(index_of(a)),
                        ceiling: None,
                    })
                },
            );
        }
    }
    t
}

fn index_of(a: &NodeAddr) -> usize {
    let ip: std::net::Ipv4Addr = a.host.parse().unwrap();
    let o = ip.octets();
    o[2] as usize * 200 + o[3] as usize - 10
}

/// Node 0's heartbeats over [`ROUNDS`] intervals of an idle `n`-member cluster, with
/// datagrams getting through both ways (so session copies are the keep-alives only).
async fn ring_cost(n: usize) -> Cost {
    let me = addr(0);
    let members: Vec<(NodeAddr, Incarnation)> = (0..n).map(|i| (addr(i), life(i))).collect();
    let watched = crate::ring::neighbours((&me, life(0)), members, K);
    let table = idle_table(n, &me);
    let key = DatagramKey::new("tenure", "cookie", &SessionSecret::generate().unwrap());
    let mut m = Monitor::new(SYNC, INTERVAL * crate::sbr::REPEAT as u32);
    let digest = table.digest();
    for p in &watched {
        m.spread.owe_full(p);
    }
    let mut sum = Cost {
        datagrams: 0.0,
        datagram_bytes: 0.0,
        session_copies: 0.0,
        session_bytes: 0.0,
    };
    for round in 0..2 * ROUNDS {
        let now = Instant::now();
        m.spread.next_round(&table);
        for p in &watched {
            let hb = Heartbeat {
                node: me.clone(),
                incarnation: life(0),
                seq: u64::from(round) * 500 + 1_000_000,
                age: 1,
                reach: m.spread.rows_for(&table, p),
                digest,
                want_table: m.take_want_table(p),
                hears_you: true,
                your_datagrams_arrive: true,
            };
            let body = datagram::encode(&hb).unwrap();
            let sealed = key.seal(&body).unwrap();
            let copy = m.session_copy_due(p, now, UNREACHABLE_AFTER / 2, UNREACHABLE_AFTER);
            if round >= ROUNDS {
                sum.datagrams += 1.0;
                sum.datagram_bytes += sealed.len() as f64;
                if copy {
                    sum.session_copies += 1.0;
                    sum.session_bytes += body.len() as f64;
                }
            }
            // The peer's heartbeat of this round came as a datagram, saying ours arrive,
            // with the same table.
            m.heard(p, true, true, now);
            m.compare(p, digest, digest, now);
        }
        tokio::time::advance(INTERVAL).await;
    }
    let r = f64::from(ROUNDS);
    Cost {
        datagrams: sum.datagrams / r,
        datagram_bytes: sum.datagram_bytes / r,
        session_copies: sum.session_copies / r,
        session_bytes: sum.session_bytes / r,
    }
}

/// The all-to-all heartbeat: every peer, as a datagram and on the session, each carrying
/// the whole table and every peer heard (the wire layout of protocol version 4).
fn all_to_all_cost(n: usize) -> Cost {
    #[derive(Serialize)]
    struct Old {
        node: NodeAddr,
        incarnation: Incarnation,
        seq: u64,
        age: u64,
        reach: Vec<ReachRow>,
        hears: Vec<NodeAddr>,
    }
    let me = addr(0);
    let hb = Old {
        node: me.clone(),
        incarnation: life(0),
        seq: 1_000_000,
        age: 1,
        reach: idle_table(n, &me).rows(),
        hears: (1..n).map(addr).collect(),
    };
    let body = bincode::serde::encode_to_vec(&hb, bincode::config::standard()).unwrap();
    let key = DatagramKey::new("tenure", "cookie", &SessionSecret::generate().unwrap());
    let sealed = key.seal(&body).unwrap();
    let peers = (n - 1) as f64;
    Cost {
        datagrams: peers,
        datagram_bytes: peers * sealed.len() as f64,
        session_copies: peers,
        session_bytes: peers * body.len() as f64,
    }
}

fn show(label: &str, n: usize, c: Cost) {
    println!(
        "{label:>11} n={n:>2}: {:5.2} messages ({:5.2} datagrams + {:5.2} session copies), {:7.0} bytes per node per interval",
        c.messages(),
        c.datagrams,
        c.session_copies,
        c.bytes()
    );
}

/// Per-node heartbeat messages and bytes at 48 members stay within 1.3 x of 12 members
/// (a node watches `2 x ceil(k/2)` = 10 peers in both; at 6 members it watches the 5 others,
/// so the cost doubles once, up to k, then stays); the all-to-all scheme grows with n.
#[tokio::test(start_paused = true)]
async fn heartbeat_cost_per_node_is_flat_from_6_to_48_members() {
    let (small, mid, large) = (ring_cost(6).await, ring_cost(12).await, ring_cost(48).await);
    let (old_small, old_large) = (all_to_all_cost(6), all_to_all_cost(48));
    show("ring", 6, small);
    show("ring", 12, mid);
    show("ring", 48, large);
    show("all-to-all", 6, old_small);
    show("all-to-all", 48, old_large);
    let ratio = |a: f64, b: f64| b / a;
    println!(
        "per node: ring 48/6 {:.2}x messages, {:.2}x bytes; ring 48/12 {:.2}x messages, {:.2}x bytes; all-to-all 48/6 {:.2}x messages, {:.2}x bytes",
        ratio(small.messages(), large.messages()),
        ratio(small.bytes(), large.bytes()),
        ratio(mid.messages(), large.messages()),
        ratio(mid.bytes(), large.bytes()),
        ratio(old_small.messages(), old_large.messages()),
        ratio(old_small.bytes(), old_large.bytes()),
    );
    assert!(ratio(mid.messages(), large.messages()) <= 1.3);
    assert!(ratio(mid.bytes(), large.bytes()) <= 1.3);
    // Per watched peer, 6 members cost what 48 do.
    let per_peer = |c: Cost, peers: f64| (c.messages() / peers, c.bytes() / peers);
    let ((m6, b6), (m48, b48)) = (per_peer(small, 5.0), per_peer(large, 10.0));
    assert!(
        m48 <= m6 * 1.3,
        "messages per watched peer: {m6} at 6, {m48} at 48"
    );
    assert!(
        b48 <= b6 * 1.3,
        "bytes per watched peer: {b6} at 6, {b48} at 48"
    );
    assert!(
        ratio(old_small.bytes(), old_large.bytes()) > 10.0,
        "the all-to-all scheme grows with n"
    );
}
