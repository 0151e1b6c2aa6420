//! Heartbeats and reachability: every `peer-heartbeat-interval` the agent sends each peer it
//! watches ([`super::monitor`]) a heartbeat (carrying the reachability rows due, see
//! [`crate::sbr::Spread`]), marks watched members silent for `unreachable-after`
//! unreachable (later when an indirect probe shows them alive), takes the reachability of
//! the others from the table, closes sessions silent far longer, and dials what is due.
//!
//! Each heartbeat goes out as an authenticated UDP datagram to the peer's cluster address
//! ([`crate::transport::datagram`]), which no data frame can hold up, and also cast on the
//! session while datagrams do not get through both ways, which still reaches a peer whose
//! UDP port a firewall blocks (there it queues behind data). Both copies carry one
//! sequence number; the first to arrive is applied and the other is a duplicate. Each peer's datagrams are sealed with
//! the key of its session, given in the hello ([`crate::transport::datagram`]); sequence
//! numbers and row versions are stamps of the sender's clock, believed only so far ahead of
//! it ([`crate::clocks`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;
use tokio::net::UdpSocket;
use tokio::time::Instant;

use super::AgentState;
use crate::clocks::{Freshness, PeerClocks};
use crate::identity::{Incarnation, NodeAddr};
use crate::protocol::{AgentLocal, AgentMsg, Heartbeat};
use crate::transport::datagram::{self, DatagramKey, Keyring, SessionSecret};

/// How a heartbeat arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Via {
    Session,
    Datagram,
}

/// Session heartbeats in a row without a datagram, over at least this many heartbeat
/// intervals, after which the datagrams of that peer are reported missing (a burst of
/// session heartbeats held up by a stalled connection is no sign of it).
const MISSING_AFTER: u32 = 20;

/// How long a failed resolution of a peer's host name waits before the next try.
const RESOLVE_RETRY: Duration = Duration::from_secs(5);

/// The heartbeat datagram channel of a node.
pub(super) struct Datagrams {
    socket: Arc<UdpSocket>,
    local: SocketAddr,
    system: String,
    cookie: String,
    /// Per peer: the secret given it in this node's hellos, and the key it makes: this
    /// node's datagrams to that peer are sealed with it, until no session with it is left.
    outbound: HashMap<NodeAddr, (SessionSecret, DatagramKey)>,
    /// The keys peers gave in their hellos, which the receiving task opens datagrams with.
    inbound: Keyring,
    /// Where each peer life takes datagrams (`None` while its host name resolves, or
    /// until `retry_at` after a failure).
    addrs: HashMap<NodeAddr, Target>,
    /// The latest heartbeat applied from each peer life, over either channel, and how far
    /// ahead its numbers may be believed.
    pub(super) clocks: PeerClocks,
    /// Per peer: session heartbeats since its last datagram.
    missing: HashMap<NodeAddr, Missing>,
    /// Whether a heartbeat too large for a datagram was reported.
    too_large_told: bool,
    /// Whether a failure of the random source was reported.
    no_secret_told: bool,
}

struct Target {
    incarnation: Incarnation,
    addr: Option<SocketAddr>,
    retry_at: Option<Instant>,
}

#[derive(Default)]
struct Missing {
    since: Option<Instant>,
    count: u32,
    told: bool,
}

impl Datagrams {
    /// The channel on `socket` (bound on the node's cluster host and port) of the cluster
    /// with `system` and `cookie`; a peer's numbers are believed up to `slack` ahead of its
    /// clock.
    pub(super) fn new(
        socket: Arc<UdpSocket>,
        system: &str,
        cookie: &str,
        slack: Duration,
    ) -> std::io::Result<Self> {
        Ok(Datagrams {
            local: socket.local_addr()?,
            socket,
            system: system.to_string(),
            cookie: cookie.to_string(),
            outbound: HashMap::new(),
            inbound: Keyring::default(),
            addrs: HashMap::new(),
            clocks: PeerClocks::new(slack),
            missing: HashMap::new(),
            too_large_told: false,
            no_secret_told: false,
        })
    }

    /// Reads the socket until `agent` stops; each authenticated heartbeat goes to the agent.
    pub(super) fn spawn_receiver(&self, agent: ActorRef<AgentMsg>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(datagram::receive(
            self.socket.clone(),
            self.inbound.clone(),
            move |hb| {
                agent
                    .cast(AgentMsg::Local(AgentLocal::Datagram(hb)))
                    .is_ok()
            },
        ))
    }

    /// The secret this node's hellos give `peer`: the one of the current session, or a new
    /// one (`None` when the random source fails; then the peer gets no datagrams).
    pub(super) fn secret_for(&mut self, peer: &NodeAddr) -> Option<SessionSecret> {
        if let Some((secret, _)) = self.outbound.get(peer) {
            return Some(secret.clone());
        }
        match SessionSecret::generate() {
            Ok(secret) => {
                let key = DatagramKey::new(&self.system, &self.cookie, &secret);
                self.outbound.insert(peer.clone(), (secret.clone(), key));
                Some(secret)
            }
            Err(e) => {
                if !self.no_secret_told {
                    self.no_secret_told = true;
                    tracing::error!(error = %e, "no random source for heartbeat datagram keys: heartbeats travel on the sessions only");
                }
                None
            }
        }
    }

    /// `peer`'s life `incarnation` said hello with `secret`: its datagrams open with the key
    /// it makes.
    pub(super) fn accept_secret(
        &mut self,
        peer: &NodeAddr,
        incarnation: Incarnation,
        secret: &SessionSecret,
    ) {
        let key = DatagramKey::new(&self.system, &self.cookie, secret);
        self.inbound.insert(peer, incarnation, key);
    }

    /// No session with `peer` is left: its keys, both ways, end with it (the next session
    /// gets new ones).
    pub(super) fn session_ended(&mut self, peer: &NodeAddr) {
        self.outbound.remove(peer);
        self.inbound.forget(peer);
    }
}

impl AgentState {
    /// Every `peer-heartbeat-interval`: heartbeats out to the watched peers, reachability,
    /// probes ([`crate::detector::Detector::tick`]), stale sessions, dials.
    pub(super) fn tick(&mut self, myself: &ActorRef<AgentMsg>) {
        let now = Instant::now();
        let seq = self.clock.stamp(now);
        let peers = self.peer_lives();
        let downed = self.downing.as_ref().is_some_and(|d| d.is_downed());
        let out = self
            .detector
            .tick(now, seq, &mut self.view, &peers, downed, &mut self.rng);
        for o in &out.heartbeats {
            self.send_datagram(myself, &o.to, o.incarnation, &o.heartbeat, now);
            if o.session_copy
                && let Some(p) = self.mesh.peers.get(&o.to)
            {
                let _ = p.agent.cast(AgentMsg::Heartbeat(o.heartbeat.clone()));
            }
        }
        for (helper, probe) in out.probes {
            self.pass_probe(&helper, probe);
        }
        self.emit(out.events);
        // ractor_cluster never times a session out: a session silent this long is
        // probably half-open (peer host gone, partition). Close it so that a redial (or
        // the peer's next life) gets a fresh one instead of losing an election to it.
        for addr in out.silent {
            self.close_stale_sessions(&addr, "silent for 3 x unreachable-after");
        }
        let watched = &self.detector.monitor.watched;
        // A session that carries no heartbeat while the peer's datagrams arrive is stuck
        // (behind a frame that never finishes, or in a middlebox): the peer is reachable,
        // yet nothing sent on it arrives (a watched peer sends one on it at least every
        // unreachable-after). A new connection gets the traffic going again.
        let stuck: Vec<NodeAddr> = self
            .mesh
            .peers
            .iter()
            .filter(|(addr, p)| {
                watched.contains(*addr)
                    && now.duration_since(p.session_heard) > self.s.unreachable_after * 3
                    && self
                        .detector
                        .reach
                        .silence(addr, now)
                        .is_some_and(|d| d < self.s.unreachable_after)
            })
            .map(|(addr, _)| addr.clone())
            .collect();
        for addr in stuck {
            self.close_stale_sessions(
                &addr,
                "no heartbeat on it for 3 x unreachable-after while the peer's datagrams arrive",
            );
        }
        self.resolve(myself, now);
        if !self.leaving {
            self.dial_due(myself, now);
        }
    }

    /// Sends `hb` as a datagram to `peer` (its life `incarnation`), sealed with the key of
    /// its session, when its address is known (else resolving it for the next tick) and
    /// its link lets datagrams out.
    fn send_datagram(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        peer: &NodeAddr,
        incarnation: Incarnation,
        hb: &Heartbeat,
        now: Instant,
    ) {
        let target = self.datagrams.addrs.get(peer);
        let due = match target {
            Some(t) if t.incarnation == incarnation => {
                t.addr.is_none() && t.retry_at.is_some_and(|at| at <= now)
            }
            _ => true,
        };
        if due {
            let addr = resolve(myself, peer, incarnation, self.datagrams.local);
            self.datagrams.addrs.insert(
                peer.clone(),
                Target {
                    incarnation,
                    addr,
                    retry_at: None,
                },
            );
        }
        let (Some(to), Some((_, key))) = (
            self.datagrams.addrs.get(peer).and_then(|t| t.addr),
            self.datagrams.outbound.get(peer),
        ) else {
            return;
        };
        #[cfg(feature = "fault-injection")]
        if !self.mesh.links.gate(peer).admits_outbound_datagram() {
            return;
        }
        let bytes = match datagram::encode(hb)
            .map_err(|e| e.to_string())
            .and_then(|b| key.seal(&b).map_err(|e| e.to_string()))
        {
            Ok(bytes) => bytes,
            Err(e) => {
                if !self.datagrams.too_large_told {
                    self.datagrams.too_large_told = true;
                    tracing::warn!(error = %e, "heartbeats travel on the sessions only");
                }
                return;
            }
        };
        if let Err(e) = self.datagrams.socket.try_send_to(&bytes, to) {
            tracing::debug!(%peer, %to, error = %e, "heartbeat datagram not sent");
        }
    }

    /// Where `peer`'s host name resolved (see [`resolve`]).
    pub(super) fn on_heartbeat_addr(
        &mut self,
        peer: NodeAddr,
        incarnation: Incarnation,
        addr: Result<SocketAddr, ResolveError>,
    ) {
        let Some(t) = self
            .datagrams
            .addrs
            .get_mut(&peer)
            .filter(|t| t.incarnation == incarnation)
        else {
            return;
        };
        match addr {
            Ok(addr) => t.addr = Some(datagram::destination(self.datagrams.local, addr)),
            Err(e) => {
                tracing::info!(%peer, error = %e, retry_in = ?RESOLVE_RETRY, "cannot resolve a peer's host for heartbeat datagrams; heartbeats reach it on the session");
                t.retry_at = Some(Instant::now() + RESOLVE_RETRY);
            }
        }
    }

    /// A heartbeat datagram whose MAC verified: applied as a heartbeat unless the link
    /// holds datagrams from its sender back (fault injection).
    pub(super) fn on_datagram(&mut self, hb: Heartbeat) {
        #[cfg(feature = "fault-injection")]
        if !self.mesh.links.gate(&hb.node).admits_inbound_datagram() {
            return;
        }
        self.on_heartbeat(hb, Via::Datagram);
    }

    /// A heartbeat from a peer, by either channel: applied only if it comes from the peer's
    /// current life (as its hello said) and is newer than every heartbeat applied from it;
    /// a number further ahead of the peer's clock than `unreachable-after / 2` counts as
    /// that far ahead only ([`crate::clocks`]).
    pub(super) fn on_heartbeat(&mut self, hb: Heartbeat, via: Via) {
        let known = self
            .mesh
            .peers
            .get(&hb.node)
            .is_some_and(|p| p.incarnation == hb.incarnation);
        if !known {
            match via {
                Via::Session => self.request_hello(&hb.node),
                // The session's copy asks for the hello; a datagram of an unknown or old
                // life (a replay) is only dropped.
                Via::Datagram => {
                    tracing::debug!(peer = %hb.node, incarnation = %hb.incarnation, "heartbeat datagram of an unknown peer life dropped")
                }
            }
            return;
        }
        let now = Instant::now();
        if via == Via::Session
            && let Some(p) = self.mesh.peers.get_mut(&hb.node)
        {
            p.session_heard = now;
        }
        self.count_missing(&hb.node, via, now);
        let seq = match self
            .datagrams
            .clocks
            .heartbeat(&hb.node, hb.incarnation, hb.seq, now)
        {
            Freshness::Fresh { believed, ahead } => {
                if ahead {
                    tracing::debug!(peer = %hb.node, seq = hb.seq, believed, ?via, "heartbeat numbered ahead of the peer's clock as known here: counted as numbered at the ceiling");
                }
                believed
            }
            Freshness::Stale => return,
            Freshness::Unknown => {
                self.request_hello(&hb.node);
                return;
            }
        };
        self.tell_if_downed(&hb.node, hb.incarnation, hb.age);
        let clocks = &self.datagrams.clocks;
        let events = self.detector.on_heartbeat(
            hb,
            seq,
            via == Via::Datagram,
            now,
            &mut self.view,
            |observer, incarnation| clocks.ceiling(observer, incarnation, now),
        );
        self.emit(events);
    }

    /// Tells (once, until they come again) when a peer's heartbeats keep coming on the
    /// session only: its datagrams do not get here (a firewall blocking UDP on the cluster
    /// port?), so its heartbeats queue behind data again.
    fn count_missing(&mut self, peer: &NodeAddr, via: Via, now: Instant) {
        let m = self.datagrams.missing.entry(peer.clone()).or_default();
        match via {
            Via::Datagram => {
                if m.told {
                    tracing::info!(%peer, "heartbeat datagrams from the peer arrive again");
                }
                *m = Missing::default();
            }
            Via::Session => {
                let since = *m.since.get_or_insert(now);
                m.count += 1;
                let span = self.s.heartbeat_interval * MISSING_AFTER / 2;
                if !m.told && m.count >= MISSING_AFTER && now.duration_since(since) >= span {
                    m.told = true;
                    tracing::warn!(
                        %peer,
                        heartbeats = m.count,
                        "no heartbeat datagram from the peer (is UDP to the cluster port blocked?); its heartbeats arrive on the session only, where they queue behind data"
                    );
                }
            }
        }
    }
}

/// `peer`'s datagram address now when its host is an IP address; else `None`, and a task
/// resolves the name and tells the agent ([`AgentLocal::HeartbeatAddr`]).
fn resolve(
    myself: &ActorRef<AgentMsg>,
    peer: &NodeAddr,
    incarnation: Incarnation,
    local: SocketAddr,
) -> Option<SocketAddr> {
    if let Some(ip) = peer.ip() {
        return Some(datagram::destination(local, SocketAddr::new(ip, peer.port)));
    }
    let (agent, peer) = (myself.clone(), peer.clone());
    tokio::spawn(async move {
        let addr = match tokio::net::lookup_host((peer.host.as_str(), peer.port)).await {
            Ok(addrs) => usable(&peer.host, addrs, local),
            Err(source) => Err(ResolveError::Lookup {
                host: peer.host.clone(),
                source,
            }),
        };
        let _ = agent.cast(AgentMsg::Local(AgentLocal::HeartbeatAddr {
            peer,
            incarnation,
            addr,
        }));
    });
    None
}

/// Why a peer's host name gave no address for heartbeat datagrams.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResolveError {
    /// The name could not be resolved.
    #[error("cannot resolve host {host:?}: {source}")]
    Lookup {
        host: String,
        #[source]
        source: std::io::Error,
    },
    /// It resolved to IPv6 addresses only, and the datagram socket is bound to IPv4 (which
    /// cannot send to IPv6).
    #[error("host {host:?} has no IPv4 address, and heartbeat datagrams are sent from IPv4")]
    NoUsableFamily { host: String },
}

/// The first of `host`'s `addrs` a socket bound to `local` can send to.
fn usable(
    host: &str,
    mut addrs: impl Iterator<Item = SocketAddr>,
    local: SocketAddr,
) -> Result<SocketAddr, ResolveError> {
    addrs
        .find(|a| local.is_ipv6() || a.is_ipv4())
        .ok_or_else(|| ResolveError::NoUsableFamily {
            host: host.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv4_socket_takes_a_hosts_first_ipv4_address_and_names_a_host_with_none() {
        let v4: SocketAddr = "10.0.0.7:2552".parse().unwrap();
        let v6: SocketAddr = "[fd00::7]:2552".parse().unwrap();
        let local_v4: SocketAddr = "0.0.0.0:2552".parse().unwrap();
        let local_v6: SocketAddr = "[::]:2552".parse().unwrap();
        assert_eq!(usable("db", [v6, v4].into_iter(), local_v4).unwrap(), v4);
        assert_eq!(usable("db", [v6, v4].into_iter(), local_v6).unwrap(), v6);
        let err = usable("db", [v6].into_iter(), local_v4).unwrap_err();
        assert!(
            matches!(&err, ResolveError::NoUsableFamily { host } if host == "db"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "host \"db\" has no IPv4 address, and heartbeat datagrams are sent from IPv4"
        );
    }
}
