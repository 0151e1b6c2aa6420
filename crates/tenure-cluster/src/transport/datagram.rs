//! The heartbeat channel: authenticated UDP datagrams between nodes, so that heartbeats
//! never queue behind the data frames of a session (ractor_cluster writes everything a
//! session sends through one queue, in order; a datagram is never behind anything).
//!
//! Every node binds a UDP socket on its cluster host and port (UDP's port space is
//! separate from TCP's) and sends each peer its heartbeat there, besides the heartbeat
//! cast on the session, which stays as the fallback where UDP is blocked. Both carry the
//! same per-sender sequence number, so the receiver applies each heartbeat once, whichever
//! channel brings it first, and never goes back to an older one ([`HeartbeatSeqs`]).
//!
//! A datagram is `bincode((body, mac))`: `body` is the bincode [`Heartbeat`] (sender
//! address, incarnation, sequence number and payload) and `mac` its HMAC-SHA256 under a
//! key made of the cluster cookie, bound to the system name. A receiver checks the MAC
//! before it decodes the body, drops datagrams of peers it knows under another incarnation
//! (or not at all) and replays (a sequence number not above the last one applied).
//! Heartbeats are authenticated, not encrypted, also with TLS: they carry reachability rows
//! and addresses only.

use std::collections::HashMap;
use std::net::SocketAddr;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::identity::{Incarnation, NodeAddr};
use crate::protocol::Heartbeat;

/// Largest datagram sent or read: the most a UDP datagram over IPv4 can carry. A heartbeat
/// too large for it (hundreds of members' rows) travels on the session only.
pub const MAX_DATAGRAM: usize = 65_507;

/// Bound on decoding (larger inputs cannot come out of one datagram anyway).
fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_DATAGRAM>()
}

/// What a heartbeat's MAC covers before the body: the purpose and version of the key's
/// use, so that a MAC made for anything else under the cookie never verifies here.
const DOMAIN: &[u8] = b"tenure heartbeat datagram v1\0";

/// Why a datagram was not sent or not accepted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DatagramError {
    /// The heartbeat could not be encoded.
    #[error("cannot encode a heartbeat datagram: {0}")]
    Encode(#[source] bincode::error::EncodeError),
    /// The sealed heartbeat exceeds [`MAX_DATAGRAM`]; it goes on the session only.
    #[error("heartbeat datagram of {bytes} bytes exceeds {MAX_DATAGRAM}")]
    TooLarge {
        /// Its size in bytes.
        bytes: usize,
    },
    /// Not a datagram of this protocol (or truncated).
    #[error("undecodable heartbeat datagram from {from}")]
    Undecodable {
        /// The sender's address.
        from: SocketAddr,
        /// The decoder's error.
        #[source]
        source: bincode::error::DecodeError,
    },
    /// The MAC does not verify: another cookie or system, or forged or corrupted.
    #[error(
        "heartbeat datagram from {from} failed authentication (another cluster cookie or system, or forged)"
    )]
    BadMac {
        /// The sender's address.
        from: SocketAddr,
    },
    /// The MAC verifies but the body is no heartbeat (a peer of another protocol version).
    #[error("authenticated heartbeat datagram from {from} has an undecodable body")]
    BadBody {
        /// The sender's address.
        from: SocketAddr,
        /// The decoder's error.
        #[source]
        source: bincode::error::DecodeError,
    },
}

/// Seals and opens the heartbeat datagrams of one cluster (cookie and system).
#[derive(Clone)]
pub struct DatagramKey {
    /// HMAC keyed with the cookie, the domain and the system already absorbed.
    keyed: Hmac<Sha256>,
}

impl std::fmt::Debug for DatagramKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DatagramKey(..)")
    }
}

impl DatagramKey {
    /// The key of the cluster with `cookie` and `system`.
    pub fn new(system: &str, cookie: &str) -> DatagramKey {
        // HMAC takes keys of any length (longer ones are hashed first).
        let mut keyed = <Hmac<Sha256> as KeyInit>::new_from_slice(cookie.as_bytes())
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
        keyed.update(DOMAIN);
        keyed.update(&(system.len() as u64).to_le_bytes());
        keyed.update(system.as_bytes());
        DatagramKey { keyed }
    }

    fn mac(&self, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.keyed.clone();
        mac.update(body);
        mac
    }

    /// The datagram carrying `hb`.
    pub fn seal(&self, hb: &Heartbeat) -> Result<Vec<u8>, DatagramError> {
        let body = bincode::serde::encode_to_vec(hb, config()).map_err(DatagramError::Encode)?;
        let tag = self.mac(&body).finalize().into_bytes().to_vec();
        let bytes = bincode::serde::encode_to_vec((&body, &tag), config())
            .map_err(DatagramError::Encode)?;
        if bytes.len() > MAX_DATAGRAM {
            return Err(DatagramError::TooLarge { bytes: bytes.len() });
        }
        Ok(bytes)
    }

    /// The heartbeat in a datagram received from `from`, once its MAC verified (in constant
    /// time). Whether it is fresh is the receiver's to judge ([`HeartbeatSeqs`]).
    pub fn open(&self, from: SocketAddr, bytes: &[u8]) -> Result<Heartbeat, DatagramError> {
        let ((body, tag), used): ((Vec<u8>, Vec<u8>), usize) =
            bincode::serde::decode_from_slice(bytes, config())
                .map_err(|source| DatagramError::Undecodable { from, source })?;
        if used != bytes.len() {
            return Err(DatagramError::BadMac { from });
        }
        self.mac(&body)
            .verify_slice(&tag)
            .map_err(|_| DatagramError::BadMac { from })?;
        let (hb, used) = bincode::serde::decode_from_slice::<Heartbeat, _>(&body, config())
            .map_err(|source| DatagramError::BadBody { from, source })?;
        if used != body.len() {
            return Err(DatagramError::BadBody {
                from,
                source: bincode::error::DecodeError::Other("trailing bytes after the heartbeat"),
            });
        }
        Ok(hb)
    }
}

/// The latest heartbeat sequence number applied from each peer life, over either channel:
/// a heartbeat is applied once (the copy on the other channel is a duplicate), and never
/// after a newer one (a datagram replayed, reordered, or a session copy that queued behind
/// data).
#[derive(Debug, Default)]
pub struct HeartbeatSeqs {
    last: HashMap<NodeAddr, (Incarnation, u64)>,
}

impl HeartbeatSeqs {
    /// Whether the heartbeat `seq` of `node`'s life `incarnation` is newer than every one
    /// applied before; records it if so. The caller has checked that `incarnation` is the
    /// peer's current life: a new life starts a new sequence.
    pub fn fresh(&mut self, node: &NodeAddr, incarnation: Incarnation, seq: u64) -> bool {
        match self.last.get_mut(node) {
            Some((inc, last)) if *inc == incarnation => {
                if seq <= *last {
                    return false;
                }
                *last = seq;
            }
            _ => {
                self.last.insert(node.clone(), (incarnation, seq));
            }
        }
        true
    }
}

/// Reads heartbeat datagrams from `socket` until `deliver` returns false (its receiver is
/// gone). Each datagram whose MAC verifies is passed on; any other is dropped and logged
/// (at warn at most once a minute, else at debug: a sender with another cookie would
/// otherwise fill the log).
pub async fn receive(
    socket: std::sync::Arc<tokio::net::UdpSocket>,
    key: DatagramKey,
    mut deliver: impl FnMut(Heartbeat) -> bool,
) {
    const WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(60);
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    let mut warned: Option<tokio::time::Instant> = None;
    loop {
        let (n, from) = match socket.recv_from(&mut buf).await {
            Ok(received) => received,
            Err(e) => {
                // On Linux an ICMP "port unreachable" for an earlier send (a peer that is
                // down) is reported here once; it says nothing about this socket.
                tracing::debug!(error = %e, "heartbeat socket: receive error");
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset
                ) {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                continue;
            }
        };
        match key.open(from, &buf[..n]) {
            Ok(hb) => {
                if !deliver(hb) {
                    return;
                }
            }
            Err(e) => {
                let now = tokio::time::Instant::now();
                if warned.is_none_or(|t| now.duration_since(t) >= WARN_EVERY) {
                    warned = Some(now);
                    tracing::warn!(error = %e, "heartbeat datagram dropped (further ones for a minute at debug)");
                } else {
                    tracing::debug!(error = %e, "heartbeat datagram dropped");
                }
            }
        }
    }
}

/// Where to send `peer` its heartbeat datagrams from a socket bound to `local`: its cluster
/// address, IPv4 mapped into IPv6 when the socket is IPv6 (dual-stack).
pub fn destination(local: SocketAddr, peer: SocketAddr) -> SocketAddr {
    match (local, peer) {
        (SocketAddr::V6(_), SocketAddr::V4(v4)) => {
            SocketAddr::new(v4.ip().to_ipv6_mapped().into(), v4.port())
        }
        _ => peer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(p: u16) -> NodeAddr {
        NodeAddr::parse("t", &format!("127.0.0.1:{p}")).unwrap()
    }

    fn from() -> SocketAddr {
        "127.0.0.1:9".parse().unwrap()
    }

    fn hb(seq: u64) -> Heartbeat {
        Heartbeat {
            node: addr(1),
            incarnation: Incarnation(7),
            seq,
            age: 3,
            reach: vec![crate::sbr::ReachRow {
                observer: addr(1),
                incarnation: Incarnation(7),
                version: 2,
                unreachable: vec![addr(2)],
            }],
            hears: vec![addr(3)],
        }
    }

    #[test]
    fn a_sealed_heartbeat_opens_with_the_same_cookie_and_system() {
        let key = DatagramKey::new("sys", "cookie");
        let sealed = key.seal(&hb(5)).unwrap();
        let opened = DatagramKey::new("sys", "cookie")
            .open(from(), &sealed)
            .unwrap();
        assert_eq!(
            (opened.node, opened.incarnation, opened.seq, opened.hears),
            (addr(1), Incarnation(7), 5, vec![addr(3)])
        );
        assert_eq!(opened.reach.len(), 1);
    }

    #[test]
    fn another_cookie_or_system_fails_authentication() {
        let sealed = DatagramKey::new("sys", "cookie").seal(&hb(5)).unwrap();
        for key in [
            DatagramKey::new("sys", "other cookie"),
            DatagramKey::new("other", "cookie"),
            DatagramKey::new("sys", ""),
        ] {
            let err = key.open(from(), &sealed).unwrap_err();
            assert!(matches!(err, DatagramError::BadMac { .. }), "{err}");
            assert!(err.to_string().contains("127.0.0.1:9"), "{err}");
        }
    }

    #[test]
    fn a_forged_or_altered_heartbeat_fails_authentication() {
        let key = DatagramKey::new("sys", "cookie");
        // A heartbeat claiming node 1 with a MAC made under a guessed key.
        let forged = DatagramKey::new("sys", "guess").seal(&hb(9)).unwrap();
        assert!(matches!(
            key.open(from(), &forged),
            Err(DatagramError::BadMac { .. })
        ));
        // Every single-bit change of a genuine datagram: refused (or undecodable).
        let sealed = key.seal(&hb(5)).unwrap();
        for i in 0..sealed.len() {
            for bit in 0..8 {
                let mut altered = sealed.clone();
                altered[i] ^= 1 << bit;
                assert!(
                    key.open(from(), &altered).is_err(),
                    "byte {i} bit {bit} changed and still accepted"
                );
            }
        }
        // The MAC of one body moved onto another: refused.
        let other = key.seal(&hb(6)).unwrap();
        let ((body, _), _): ((Vec<u8>, Vec<u8>), usize) =
            bincode::serde::decode_from_slice(&other, config()).unwrap();
        let ((_, tag), _): ((Vec<u8>, Vec<u8>), usize) =
            bincode::serde::decode_from_slice(&sealed, config()).unwrap();
        let spliced = bincode::serde::encode_to_vec((&body, &tag), config()).unwrap();
        assert!(matches!(
            key.open(from(), &spliced),
            Err(DatagramError::BadMac { .. })
        ));
        // Truncated and trailing bytes.
        assert!(key.open(from(), &sealed[..sealed.len() - 1]).is_err());
        let mut longer = sealed.clone();
        longer.push(0);
        assert!(key.open(from(), &longer).is_err());
        assert!(key.open(from(), &[]).is_err());
    }

    #[test]
    fn replays_and_older_heartbeats_are_not_fresh_and_a_new_life_starts_over() {
        let mut seqs = HeartbeatSeqs::default();
        let (a, b) = (addr(1), addr(2));
        assert!(seqs.fresh(&a, Incarnation(7), 1));
        assert!(
            !seqs.fresh(&a, Incarnation(7), 1),
            "the same heartbeat twice"
        );
        assert!(seqs.fresh(&a, Incarnation(7), 3));
        assert!(!seqs.fresh(&a, Incarnation(7), 2), "older than one applied");
        assert!(
            seqs.fresh(&b, Incarnation(7), 1),
            "sequences are per sender"
        );
        assert!(seqs.fresh(&a, Incarnation(8), 1), "a new life starts over");
        assert!(!seqs.fresh(&a, Incarnation(8), 1));
    }

    #[tokio::test]
    async fn the_receiver_passes_on_only_datagrams_sealed_with_the_cluster_key() {
        use std::sync::Arc;
        let socket = Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let to = socket.local_addr().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let receiver = tokio::spawn(receive(
            socket,
            DatagramKey::new("sys", "cookie"),
            move |hb| tx.send(hb).is_ok(),
        ));
        let sender = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let good = DatagramKey::new("sys", "cookie");
        let mut forged = good.seal(&hb(1)).unwrap();
        let last = forged.len() - 1;
        forged[last] ^= 1;
        for bad in [
            DatagramKey::new("sys", "wrong cookie")
                .seal(&hb(2))
                .unwrap(),
            DatagramKey::new("other system", "cookie")
                .seal(&hb(3))
                .unwrap(),
            forged,
            b"not a heartbeat".to_vec(),
        ] {
            sender.send_to(&bad, to).await.unwrap();
        }
        sender
            .send_to(&good.seal(&hb(4)).unwrap(), to)
            .await
            .unwrap();
        // Loopback keeps one sender's datagrams in order: the first heartbeat passed on
        // is the genuine one, sent last.
        let first = rx.recv().await.unwrap();
        assert_eq!(first.seq, 4);
        receiver.abort();
    }

    #[test]
    fn ipv4_peers_are_mapped_for_a_dual_stack_socket() {
        let v6: SocketAddr = "[::]:4701".parse().unwrap();
        let v4: SocketAddr = "127.0.0.1:4701".parse().unwrap();
        let peer: SocketAddr = "10.0.0.2:4702".parse().unwrap();
        assert_eq!(
            destination(v6, peer),
            "[::ffff:10.0.0.2]:4702".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(destination(v4, peer), peer);
    }
}
