//! The heartbeat channel: authenticated UDP datagrams between nodes, so that heartbeats
//! never queue behind the data frames of a session (ractor_cluster writes everything a
//! session sends through one queue, in order; a datagram is never behind anything).
//!
//! Every node binds a UDP socket on its cluster host and port (UDP's port space is
//! separate from TCP's) and sends each peer it watches its heartbeat there; the heartbeat
//! is cast on the session too while datagrams do not get through both ways, the fallback
//! where UDP is blocked. Both carry the same sequence number (a stamp of the sender's
//! clock, see [`crate::clocks`]), so the receiver applies each heartbeat once, whichever
//! channel brings it first, and never goes back to an older one.
//!
//! Datagrams are keyed per session: the hello a node sends a peer on their session carries
//! a fresh random [`SessionSecret`], and the node seals its datagrams to that peer with a
//! [`DatagramKey`] made of the cluster cookie, the system name and that secret. With TLS
//! the secret travels encrypted, so knowing the cookie is not enough to forge a datagram:
//! one needs the session, hence a certificate. Without TLS, the cookie is also what admits
//! a session, and the secret keeps datagrams of one session from being replayed into the
//! next.
//!
//! A datagram is `bincode((key id, body, mac))`: `body` is the bincode [`Heartbeat`]
//! (sender address, incarnation, sequence number and payload) and `mac` its HMAC-SHA256
//! under the key `key id` names. A receiver looks the key up in its [`Keyring`] (the keys
//! its peers gave it in their hellos), checks the MAC before it decodes the body, and
//! passes on only a heartbeat in the name of the peer that gave the key. Heartbeats are
//! authenticated, not encrypted: they carry reachability rows and addresses only.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
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
const DOMAIN: &[u8] = b"tenure heartbeat datagram v2\0";

/// How many keys of one peer life a keyring keeps: the newest, and the one before it (a
/// hello of the session before may still be on its way when the next one arrives).
const KEYS_PER_PEER: usize = 2;

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
    /// Sealed with a key no peer gave this node: no session with the sender, a session
    /// that ended, or forged.
    #[error(
        "heartbeat datagram from {from} sealed with an unknown key (no session with the sender, an ended session, or forged)"
    )]
    UnknownKey {
        /// The sender's address.
        from: SocketAddr,
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
    /// Sealed with the key one peer gave, in the name of another node or life.
    #[error(
        "heartbeat datagram from {from} claims {claimed} ({claimed_incarnation}) but is sealed with the key of {peer} ({incarnation})"
    )]
    WrongSender {
        /// The sender's address.
        from: SocketAddr,
        /// The node the heartbeat names.
        claimed: NodeAddr,
        /// The life the heartbeat names.
        claimed_incarnation: Incarnation,
        /// The peer whose key sealed it.
        peer: NodeAddr,
        /// That peer's life.
        incarnation: Incarnation,
    },
}

/// The secret one node gives a peer in its hello, for the datagrams it will send that peer
/// during their session. Its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSecret {
    /// Names the key in each datagram (random, not secret).
    pub id: u64,
    /// The secret itself.
    pub bytes: [u8; 32],
}

impl std::fmt::Debug for SessionSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionSecret({:016x}, ..)", self.id)
    }
}

impl SessionSecret {
    /// A fresh secret from the operating system's random source; `Err` when it has none.
    pub fn generate() -> Result<SessionSecret, getrandom::Error> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)?;
        Ok(SessionSecret {
            id: getrandom::u64()?,
            bytes,
        })
    }
}

/// Seals and opens the heartbeat datagrams of one direction of one session.
#[derive(Clone)]
pub struct DatagramKey {
    id: u64,
    /// HMAC keyed with the cookie, the domain, the system and the session secret already
    /// absorbed.
    keyed: Hmac<Sha256>,
}

impl std::fmt::Debug for DatagramKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DatagramKey({:016x}, ..)", self.id)
    }
}

/// The bincode of a heartbeat, to seal once per peer.
pub fn encode(hb: &Heartbeat) -> Result<Vec<u8>, DatagramError> {
    bincode::serde::encode_to_vec(hb, config()).map_err(DatagramError::Encode)
}

impl DatagramKey {
    /// The key of the cluster with `cookie` and `system` for the session that `secret`
    /// was given for.
    pub fn new(system: &str, cookie: &str, secret: &SessionSecret) -> DatagramKey {
        // HMAC takes keys of any length (longer ones are hashed first).
        let mut keyed = <Hmac<Sha256> as KeyInit>::new_from_slice(cookie.as_bytes())
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
        keyed.update(DOMAIN);
        keyed.update(&(system.len() as u64).to_le_bytes());
        keyed.update(system.as_bytes());
        keyed.update(&secret.bytes);
        keyed.update(&secret.id.to_le_bytes());
        DatagramKey {
            id: secret.id,
            keyed,
        }
    }

    fn mac(&self, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.keyed.clone();
        mac.update(body);
        mac
    }

    /// The datagram carrying `body` (from [`encode`]).
    pub fn seal(&self, body: &[u8]) -> Result<Vec<u8>, DatagramError> {
        let tag = self.mac(body).finalize().into_bytes().to_vec();
        let bytes = bincode::serde::encode_to_vec((self.id, body, &tag), config())
            .map_err(DatagramError::Encode)?;
        if bytes.len() > MAX_DATAGRAM {
            return Err(DatagramError::TooLarge { bytes: bytes.len() });
        }
        Ok(bytes)
    }

    /// The body of `tag`'s datagram, once the MAC verified (in constant time).
    fn verify(&self, from: SocketAddr, body: &[u8], tag: &[u8]) -> Result<(), DatagramError> {
        self.mac(body)
            .verify_slice(tag)
            .map_err(|_| DatagramError::BadMac { from })
    }
}

/// The keys this node opens datagrams with: each one a peer life gave in a hello. Shared
/// between the agent, which adds and drops keys as sessions come and go, and the task that
/// reads the socket.
#[derive(Clone, Default)]
pub struct Keyring {
    keys: Arc<Mutex<Keys>>,
}

#[derive(Default)]
struct Keys {
    by_id: HashMap<u64, Given>,
    /// Numbers the keys in the order they were given.
    given: u64,
}

struct Given {
    peer: NodeAddr,
    incarnation: Incarnation,
    key: DatagramKey,
    order: u64,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keyring(..)")
    }
}

impl Keyring {
    fn lock(&self) -> std::sync::MutexGuard<'_, Keys> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `peer`'s life `incarnation` seals its datagrams with `key` from now on. Keys of its
    /// other lives are dropped, and of this life only the newest [`KEYS_PER_PEER`] kept.
    pub fn insert(&self, peer: &NodeAddr, incarnation: Incarnation, key: DatagramKey) {
        let mut keys = self.lock();
        keys.by_id
            .retain(|_, g| g.peer != *peer || g.incarnation == incarnation);
        keys.given += 1;
        let order = keys.given;
        keys.by_id.insert(
            key.id,
            Given {
                peer: peer.clone(),
                incarnation,
                key,
                order,
            },
        );
        let mut mine: Vec<(u64, u64)> = keys
            .by_id
            .iter()
            .filter(|(_, g)| g.peer == *peer)
            .map(|(id, g)| (g.order, *id))
            .collect();
        mine.sort_unstable();
        for (_, id) in mine.iter().rev().skip(KEYS_PER_PEER) {
            keys.by_id.remove(id);
        }
    }

    /// Drops every key of `peer` (its sessions ended).
    pub fn forget(&self, peer: &NodeAddr) {
        self.lock().by_id.retain(|_, g| g.peer != *peer);
    }

    /// The heartbeat in a datagram received from `from`, once its MAC verified under the
    /// key it names and it proved to come from the peer life that gave that key. Whether it
    /// is fresh is the receiver's to judge ([`crate::clocks::PeerClocks`]).
    pub fn open(&self, from: SocketAddr, bytes: &[u8]) -> Result<Heartbeat, DatagramError> {
        let ((id, body, tag), used): ((u64, Vec<u8>, Vec<u8>), usize) =
            bincode::serde::decode_from_slice(bytes, config())
                .map_err(|source| DatagramError::Undecodable { from, source })?;
        if used != bytes.len() {
            return Err(DatagramError::BadMac { from });
        }
        let (peer, incarnation) = {
            let keys = self.lock();
            let given = keys
                .by_id
                .get(&id)
                .ok_or(DatagramError::UnknownKey { from })?;
            given.key.verify(from, &body, &tag)?;
            (given.peer.clone(), given.incarnation)
        };
        let (hb, used) = bincode::serde::decode_from_slice::<Heartbeat, _>(&body, config())
            .map_err(|source| DatagramError::BadBody { from, source })?;
        if used != body.len() {
            return Err(DatagramError::BadBody {
                from,
                source: bincode::error::DecodeError::Other("trailing bytes after the heartbeat"),
            });
        }
        if hb.node != peer || hb.incarnation != incarnation {
            return Err(DatagramError::WrongSender {
                from,
                claimed: hb.node,
                claimed_incarnation: hb.incarnation,
                peer,
                incarnation,
            });
        }
        Ok(hb)
    }
}

/// Reads heartbeat datagrams from `socket` until `deliver` returns false (its receiver is
/// gone). Each datagram that `keys` opens is passed on; any other is dropped and logged
/// (at warn at most once a minute, else at debug: a sender with another cookie would
/// otherwise fill the log).
pub async fn receive(
    socket: Arc<tokio::net::UdpSocket>,
    keys: Keyring,
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
        match keys.open(from, &buf[..n]) {
            Ok(hb) => {
                if !deliver(hb) {
                    return;
                }
            }
            // Expected around session changes: a peer's datagrams may arrive just before
            // its hello gives the key, or just after its session ended.
            Err(e @ DatagramError::UnknownKey { .. }) => {
                tracing::debug!(error = %e, "heartbeat datagram dropped");
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
            reach: vec![std::sync::Arc::new(crate::sbr::ReachRow {
                observer: addr(1),
                incarnation: Incarnation(7),
                version: 2,
                unreachable: vec![addr(2)],
            })],
            digest: 9,
            want_table: false,
            hears_you: true,
            your_datagrams_arrive: false,
        }
    }

    fn secret(id: u64) -> SessionSecret {
        SessionSecret {
            id,
            bytes: [id as u8; 32],
        }
    }

    /// The keyring of a node whose session with node 1 (life 7) gave `secret`.
    fn ring(secret: &SessionSecret) -> Keyring {
        let ring = Keyring::default();
        ring.insert(
            &addr(1),
            Incarnation(7),
            DatagramKey::new("sys", "cookie", secret),
        );
        ring
    }

    fn sealed(key: &DatagramKey, hb: &Heartbeat) -> Vec<u8> {
        key.seal(&encode(hb).unwrap()).unwrap()
    }

    /// Rows shared in this process are plain rows on the wire: a heartbeat encodes as it
    /// did with `Vec<ReachRow>`, and decodes to the same rows.
    #[test]
    fn shared_rows_keep_the_heartbeat_wire_format() {
        #[derive(serde::Serialize)]
        struct Plain {
            node: NodeAddr,
            incarnation: Incarnation,
            seq: u64,
            age: u64,
            reach: Vec<crate::sbr::ReachRow>,
            digest: u64,
            want_table: bool,
            hears_you: bool,
            your_datagrams_arrive: bool,
        }
        let hb = hb(5);
        let plain = Plain {
            node: hb.node.clone(),
            incarnation: hb.incarnation,
            seq: hb.seq,
            age: hb.age,
            reach: hb
                .reach
                .iter()
                .map(|r| crate::sbr::ReachRow::clone(r))
                .collect(),
            digest: hb.digest,
            want_table: hb.want_table,
            hears_you: hb.hears_you,
            your_datagrams_arrive: hb.your_datagrams_arrive,
        };
        let bytes = encode(&hb).unwrap();
        assert_eq!(
            bytes,
            bincode::serde::encode_to_vec(&plain, config()).unwrap()
        );
        let (back, _): (Heartbeat, usize) =
            bincode::serde::decode_from_slice(&bytes, config()).unwrap();
        assert_eq!(back.reach, hb.reach);
    }

    #[test]
    fn a_sealed_heartbeat_opens_with_the_key_of_its_session() {
        let s = secret(5);
        let bytes = sealed(&DatagramKey::new("sys", "cookie", &s), &hb(5));
        let opened = ring(&s).open(from(), &bytes).unwrap();
        assert_eq!(
            (
                opened.node,
                opened.incarnation,
                opened.seq,
                opened.hears_you
            ),
            (addr(1), Incarnation(7), 5, true)
        );
        assert_eq!(opened.reach.len(), 1);
    }

    #[test]
    fn another_cookie_system_or_session_fails_authentication() {
        let s = secret(5);
        let ring = ring(&s);
        let mut other_bytes = s.clone();
        other_bytes.bytes[0] ^= 1;
        for key in [
            DatagramKey::new("sys", "other cookie", &s),
            DatagramKey::new("other", "cookie", &s),
            DatagramKey::new("sys", "", &s),
            DatagramKey::new("sys", "cookie", &other_bytes),
        ] {
            let err = ring.open(from(), &sealed(&key, &hb(5))).unwrap_err();
            assert!(matches!(err, DatagramError::BadMac { .. }), "{err}");
            assert!(err.to_string().contains("127.0.0.1:9"), "{err}");
        }
        // A key no session gave: the cookie alone, or another session's.
        let err = ring
            .open(
                from(),
                &sealed(&DatagramKey::new("sys", "cookie", &secret(6)), &hb(5)),
            )
            .unwrap_err();
        assert!(matches!(err, DatagramError::UnknownKey { .. }), "{err}");
    }

    #[test]
    fn a_forged_or_altered_heartbeat_fails_authentication() {
        let s = secret(5);
        let key = DatagramKey::new("sys", "cookie", &s);
        let ring = ring(&s);
        // Every single-bit change of a genuine datagram: refused (or undecodable).
        let genuine = sealed(&key, &hb(5));
        for i in 0..genuine.len() {
            for bit in 0..8 {
                let mut altered = genuine.clone();
                altered[i] ^= 1 << bit;
                assert!(
                    ring.open(from(), &altered).is_err(),
                    "byte {i} bit {bit} changed and still accepted"
                );
            }
        }
        // The MAC of one body moved onto another: refused.
        let decode = |b: &[u8]| -> (u64, Vec<u8>, Vec<u8>) {
            bincode::serde::decode_from_slice(b, config()).unwrap().0
        };
        let (id, body, _) = decode(&sealed(&key, &hb(6)));
        let (_, _, tag) = decode(&genuine);
        let spliced = bincode::serde::encode_to_vec((id, &body, &tag), config()).unwrap();
        assert!(matches!(
            ring.open(from(), &spliced),
            Err(DatagramError::BadMac { .. })
        ));
        // Truncated and trailing bytes.
        assert!(ring.open(from(), &genuine[..genuine.len() - 1]).is_err());
        let mut longer = genuine.clone();
        longer.push(0);
        assert!(ring.open(from(), &longer).is_err());
        assert!(ring.open(from(), &[]).is_err());
    }

    #[test]
    fn a_peers_key_speaks_only_for_that_peer_life() {
        let s = secret(5);
        let key = DatagramKey::new("sys", "cookie", &s);
        let ring = ring(&s);
        let mut other_node = hb(5);
        other_node.node = addr(2);
        let mut other_life = hb(5);
        other_life.incarnation = Incarnation(8);
        for claim in [other_node, other_life] {
            let err = ring.open(from(), &sealed(&key, &claim)).unwrap_err();
            assert!(matches!(err, DatagramError::WrongSender { .. }), "{err}");
        }
    }

    #[test]
    fn the_keyring_keeps_the_two_newest_keys_of_the_current_life() {
        let ring = Keyring::default();
        let key = |id| DatagramKey::new("sys", "cookie", &secret(id));
        let opens = |id: u64, life: u64| {
            let mut h = hb(1);
            h.incarnation = Incarnation(life);
            ring.open(from(), &sealed(&key(id), &h)).is_ok()
        };
        ring.insert(&addr(1), Incarnation(7), key(1));
        ring.insert(&addr(1), Incarnation(7), key(2));
        assert!(opens(1, 7) && opens(2, 7));
        ring.insert(&addr(1), Incarnation(7), key(3));
        assert!(!opens(1, 7) && opens(2, 7) && opens(3, 7));
        ring.insert(&addr(1), Incarnation(8), key(4));
        assert!(
            !opens(3, 7) && opens(4, 8),
            "another life drops the old keys"
        );
        ring.forget(&addr(1));
        assert!(!opens(4, 8));
    }

    #[tokio::test]
    async fn the_receiver_passes_on_only_datagrams_sealed_with_a_session_key() {
        use hmac::Mac as _;
        let socket = Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let to = socket.local_addr().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let s = secret(5);
        let receiver = tokio::spawn(receive(socket, ring(&s), move |hb| tx.send(hb).is_ok()));
        let sender = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let good = DatagramKey::new("sys", "cookie", &s);
        // A datagram sealed the way a node keyed by the cookie alone would seal it.
        let cookie_only = {
            let body = encode(&hb(2)).unwrap();
            let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(b"cookie").unwrap();
            mac.update(b"tenure heartbeat datagram v1\0");
            mac.update(&3u64.to_le_bytes());
            mac.update(b"sys");
            mac.update(&body);
            let tag = mac.finalize().into_bytes().to_vec();
            bincode::serde::encode_to_vec((&body, &tag), config()).unwrap()
        };
        let mut forged = sealed(&good, &hb(1));
        let last = forged.len() - 1;
        forged[last] ^= 1;
        for bad in [
            cookie_only,
            sealed(&DatagramKey::new("sys", "cookie", &secret(9)), &hb(3)),
            sealed(&DatagramKey::new("sys", "wrong cookie", &s), &hb(3)),
            forged,
            b"not a heartbeat".to_vec(),
        ] {
            sender.send_to(&bad, to).await.unwrap();
        }
        sender.send_to(&sealed(&good, &hb(4)), to).await.unwrap();
        // Loopback keeps one sender's datagrams in order: the first heartbeat passed on
        // is the genuine one, sent last.
        let first = rx.recv().await.unwrap();
        assert_eq!(first.seq, 4);
        receiver.abort();
    }

    #[test]
    fn secrets_are_random_and_not_shown() {
        let (a, b) = (
            SessionSecret::generate().unwrap(),
            SessionSecret::generate().unwrap(),
        );
        assert_ne!(a, b);
        let shown = format!("{a:?} {:?}", DatagramKey::new("s", "c", &a));
        assert!(!shown.contains(&format!("{:?}", a.bytes)), "{shown}");
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
