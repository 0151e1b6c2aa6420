//! The gates of fault injection (feature `fault-injection`): a per-peer switch over the
//! traffic of the connections this node dialled, that stalls it while the TCP connection
//! stays open, in both directions or one, or drops it (connections reset, dials refused),
//! and over the heartbeat datagrams exchanged with that peer (not delivered while the
//! direction is stalled or the link dropped). A session stall holds only the connections
//! open when it was set (stuck streams): a new connection flows.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::LinkFault;
use crate::identity::NodeAddr;

impl LinkFault {
    fn bits(self) -> u8 {
        match self {
            LinkFault::None => 0,
            LinkFault::Stall => IN | OUT,
            LinkFault::StallInbound => IN,
            LinkFault::StallOutbound => OUT,
            LinkFault::Drop => DROP,
            LinkFault::StallSession => IN | OUT | SESSION_ONLY,
        }
    }

    fn from_bits(bits: u8) -> LinkFault {
        match bits {
            0 => LinkFault::None,
            IN => LinkFault::StallInbound,
            OUT => LinkFault::StallOutbound,
            DROP => LinkFault::Drop,
            b if b & SESSION_ONLY != 0 => LinkFault::StallSession,
            _ => LinkFault::Stall,
        }
    }
}

const IN: u8 = 1;
const OUT: u8 = 2;
const DROP: u8 = 4;
/// The stall holds the session only; datagrams pass.
const SESSION_ONLY: u8 = 8;

/// A switch over the traffic of the connections it guards (see [`LinkFault`]).
#[derive(Debug, Default)]
pub struct Gate {
    state: AtomicU8,
    wakers: Mutex<Vec<Waker>>,
    /// The number of connections wrapped so far (each one's id).
    opened: AtomicU64,
    /// A session stall holds the connections with an id below this (those open when it
    /// was set).
    stuck_below: AtomicU64,
}

impl Gate {
    /// Sets the fault; lifting a stall resumes the waiting traffic.
    pub fn set(&self, fault: LinkFault) {
        if fault == LinkFault::StallSession {
            self.stuck_below
                .store(self.opened.load(Ordering::SeqCst), Ordering::SeqCst);
        }
        self.state.store(fault.bits(), Ordering::SeqCst);
        let wakers = std::mem::take(&mut *self.wakers.lock().unwrap_or_else(|e| e.into_inner()));
        wakers.into_iter().for_each(Waker::wake);
    }

    /// The fault in force.
    pub fn fault(&self) -> LinkFault {
        LinkFault::from_bits(self.state.load(Ordering::SeqCst))
    }

    /// Whether any fault is in force.
    pub fn is_cut(&self) -> bool {
        self.fault() != LinkFault::None
    }

    /// Whether a heartbeat datagram from the peer may be delivered now.
    pub fn admits_inbound_datagram(&self) -> bool {
        self.admits_datagram(IN)
    }

    /// Whether a heartbeat datagram may be sent to the peer now.
    pub fn admits_outbound_datagram(&self) -> bool {
        self.admits_datagram(OUT)
    }

    fn admits_datagram(&self, dir: u8) -> bool {
        let s = self.state.load(Ordering::SeqCst);
        s & DROP == 0 && (s & dir == 0 || s & SESSION_ONLY != 0)
    }

    /// Wraps a new connection to the peer.
    pub fn wrap<S>(self: &Arc<Self>, inner: S) -> Gated<S> {
        Gated {
            inner,
            id: self.opened.fetch_add(1, Ordering::SeqCst),
            gate: self.clone(),
        }
    }

    /// Ready when traffic in direction `dir` (`IN` or `OUT`) of connection `id` may pass;
    /// an error while the link is dropped.
    fn poll_open(&self, id: u64, dir: u8, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let check = || {
            let s = self.state.load(Ordering::SeqCst);
            if s & DROP != 0 {
                Some(Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "link dropped by fault injection",
                )))
            } else if s & dir == 0
                || (s & SESSION_ONLY != 0 && id >= self.stuck_below.load(Ordering::SeqCst))
            {
                Some(Ok(()))
            } else {
                None
            }
        };
        if let Some(r) = check() {
            return Poll::Ready(r);
        }
        self.wakers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(cx.waker().clone());
        // Re-check: a heal between the first check and the push must not be missed.
        match check() {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

/// The gates of one node, one per peer address.
#[derive(Debug, Default)]
pub struct Links {
    gates: Mutex<HashMap<NodeAddr, Arc<Gate>>>,
}

impl Links {
    /// The gate of connections to `peer`.
    pub fn gate(&self, peer: &NodeAddr) -> Arc<Gate> {
        self.gates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(peer.clone())
            .or_default()
            .clone()
    }

    /// The peers whose links are cut now.
    pub fn cut_peers(&self) -> Vec<NodeAddr> {
        self.gates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, g)| g.is_cut())
            .map(|(a, _)| a.clone())
            .collect()
    }
}

/// A byte stream whose reads and writes wait while its gate is cut.
pub struct Gated<S> {
    inner: S,
    id: u64,
    gate: Arc<Gate>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Gated<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        ready!(self.gate.poll_open(self.id, IN, cx))?;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Gated<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.gate.poll_open(self.id, OUT, cx))?;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.gate.poll_open(self.id, OUT, cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_cut_gate_stalls_and_a_heal_resumes_without_loss() {
        let (a, mut b) = tokio::io::duplex(64);
        let gate = Arc::new(Gate::default());
        let mut gated = gate.wrap(a);
        gated.write_all(b"one").await.unwrap();
        let mut buf = [0u8; 3];
        b.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"one");

        gate.set(LinkFault::Stall);
        b.write_all(b"two").await.unwrap();
        let mut read = [0u8; 3];
        let stalled =
            tokio::time::timeout(Duration::from_millis(50), gated.read_exact(&mut read)).await;
        assert!(stalled.is_err(), "reads wait while cut");
        let write = tokio::spawn(async move {
            gated.write_all(b"three").await.unwrap();
            gated
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!write.is_finished(), "writes wait while cut");
        gate.set(LinkFault::None);
        let mut gated = write.await.unwrap();
        let mut got = [0u8; 5];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"three");
        gated.read_exact(&mut read).await.unwrap();
        assert_eq!(&read, b"two");
    }

    #[tokio::test]
    async fn one_way_stalls_only_its_direction_and_drop_resets() {
        let (a, mut b) = tokio::io::duplex(64);
        let gate = Arc::new(Gate::default());
        let mut gated = gate.wrap(a);
        gate.set(LinkFault::StallOutbound);
        b.write_all(b"in").await.unwrap();
        let mut two = [0u8; 2];
        gated.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"in", "inbound flows while only outbound stalls");
        let stalled =
            tokio::time::timeout(Duration::from_millis(50), gated.write_all(b"out")).await;
        assert!(stalled.is_err(), "outbound waits");
        gate.set(LinkFault::StallInbound);
        gated.write_all(b"out").await.unwrap();
        b.write_all(b"in").await.unwrap();
        let stalled =
            tokio::time::timeout(Duration::from_millis(50), gated.read_exact(&mut two)).await;
        assert!(stalled.is_err(), "inbound waits");
        gate.set(LinkFault::Drop);
        let err = gated.read_exact(&mut two).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        assert!(gated.write_all(b"x").await.is_err());
        assert_eq!(gate.fault(), LinkFault::Drop);
    }

    #[test]
    fn datagrams_pass_in_the_directions_the_session_flows_except_a_session_stall() {
        let gate = Gate::default();
        let cases = [
            (LinkFault::None, true, true),
            (LinkFault::Stall, false, false),
            (LinkFault::StallInbound, false, true),
            (LinkFault::StallOutbound, true, false),
            (LinkFault::Drop, false, false),
            (LinkFault::StallSession, true, true),
        ];
        for (fault, inbound, outbound) in cases {
            gate.set(fault);
            assert_eq!(gate.fault(), fault);
            assert_eq!(
                (
                    gate.admits_inbound_datagram(),
                    gate.admits_outbound_datagram()
                ),
                (inbound, outbound),
                "{fault:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_session_stall_holds_the_stream_both_ways() {
        let (a, mut b) = tokio::io::duplex(64);
        let gate = Arc::new(Gate::default());
        let mut gated = gate.wrap(a);
        gate.set(LinkFault::StallSession);
        b.write_all(b"in").await.unwrap();
        let mut two = [0u8; 2];
        let stalled =
            tokio::time::timeout(Duration::from_millis(50), gated.read_exact(&mut two)).await;
        assert!(stalled.is_err(), "inbound waits");
        let stalled =
            tokio::time::timeout(Duration::from_millis(50), gated.write_all(b"out")).await;
        assert!(stalled.is_err(), "outbound waits");
        // A connection opened since flows: the stall holds stuck streams only.
        let (c, mut d) = tokio::io::duplex(64);
        let mut fresh = gate.wrap(c);
        fresh.write_all(b"ok").await.unwrap();
        d.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"ok");
        gate.set(LinkFault::None);
        gated.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"in");
    }
}
