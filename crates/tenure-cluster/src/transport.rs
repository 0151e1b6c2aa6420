//! Connections between nodes: outbound dials (plain or TLS) through a per-peer [`Gate`]
//! that fault injection uses to stall traffic while the TCP connection stays open, in both
//! directions or one, or to drop it (connections reset, dials refused); and the TLS
//! configuration.
//!
//! Every session between two Tenure nodes starts as a dial by one of them, and ractor keeps
//! one session per pair; so a fault set on *both* nodes reaches whichever connection
//! survived: to lose what A sends B, stall A's outbound and B's inbound traffic.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use ractor::ActorRef;
use ractor_cluster::{BoxRead, BoxWrite, ClusterBidiStream, NodeServerMessage};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::error::ClusterError;
use crate::identity::NodeAddr;
use crate::settings::TlsFiles;

/// What fault injection does to this node's traffic with one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum LinkFault {
    /// Traffic flows.
    #[default]
    None,
    /// Both directions stall; the TCP connection stays open and nothing is lost.
    Stall,
    /// What this node receives from the peer stalls (set with the peer's `StallOutbound`
    /// for one-way loss).
    StallInbound,
    /// What this node sends to the peer stalls.
    StallOutbound,
    /// Connections fail with a reset and dials are refused, as a firewall rejecting them.
    Drop,
}

impl LinkFault {
    fn bits(self) -> u8 {
        match self {
            LinkFault::None => 0,
            LinkFault::Stall => IN | OUT,
            LinkFault::StallInbound => IN,
            LinkFault::StallOutbound => OUT,
            LinkFault::Drop => DROP,
        }
    }

    fn from_bits(bits: u8) -> LinkFault {
        match bits {
            0 => LinkFault::None,
            IN => LinkFault::StallInbound,
            OUT => LinkFault::StallOutbound,
            DROP => LinkFault::Drop,
            _ => LinkFault::Stall,
        }
    }

    /// Its name in `tenure cluster fault --mode` and in histories.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkFault::None => "none",
            LinkFault::Stall => "stall",
            LinkFault::StallInbound => "inbound",
            LinkFault::StallOutbound => "outbound",
            LinkFault::Drop => "drop",
        }
    }
}

const IN: u8 = 1;
const OUT: u8 = 2;
const DROP: u8 = 4;

/// A switch over the traffic of the connections it guards (see [`LinkFault`]).
#[derive(Debug, Default)]
pub struct Gate {
    state: AtomicU8,
    wakers: Mutex<Vec<Waker>>,
}

impl Gate {
    /// Sets the fault; lifting a stall resumes the waiting traffic.
    pub fn set(&self, fault: LinkFault) {
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

    /// Ready when traffic in direction `dir` (`IN` or `OUT`) may pass; an error while the
    /// link is dropped.
    fn poll_open(&self, dir: u8, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let check = || {
            let s = self.state.load(Ordering::SeqCst);
            if s & DROP != 0 {
                Some(Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "link dropped by fault injection",
                )))
            } else if s & dir == 0 {
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
    gate: Arc<Gate>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Gated<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        ready!(self.gate.poll_open(IN, cx))?;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Gated<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.gate.poll_open(OUT, cx))?;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.gate.poll_open(OUT, cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A connected stream handed to ractor_cluster.
struct Conn<S> {
    stream: S,
    peer: String,
    local: String,
}

impl<S: AsyncRead + AsyncWrite + Send + 'static> ClusterBidiStream for Conn<S> {
    fn split(self: Box<Self>) -> (BoxRead, BoxWrite) {
        let (r, w) = tokio::io::split(self.stream);
        (Box::new(r), Box::new(w))
    }

    fn peer_label(&self) -> Option<String> {
        Some(self.peer.clone())
    }

    fn local_label(&self) -> Option<String> {
        Some(self.local.clone())
    }
}

/// TLS for node-to-node traffic: both sides present certificates chaining to one CA.
#[derive(Clone)]
pub struct Tls {
    pub acceptor: TlsAcceptor,
    pub connector: TlsConnector,
    /// SHA-256 of the CA certificates: nodes trusting another CA are another cluster.
    pub ca_fingerprint: String,
}

impl Tls {
    /// Loads the PEM files; errors name the config key and the path.
    pub fn load(files: &TlsFiles) -> Result<Tls, ClusterError> {
        let err = |key: &str, path: &std::path::Path, detail: String| ClusterError::Tls {
            key: format!("cluster.tls.{key}"),
            path: path.display().to_string(),
            detail,
        };
        let certs = |key: &str,
                     path: &std::path::Path|
         -> Result<Vec<CertificateDer<'static>>, ClusterError> {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| err(key, path, e.to_string()))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| err(key, path, e.to_string()))?;
            if certs.is_empty() {
                return Err(err(key, path, "no PEM certificate in the file".into()));
            }
            Ok(certs)
        };
        let chain = certs("cert", &files.cert)?;
        let ca = certs("ca", &files.ca)?;
        let key = PrivateKeyDer::from_pem_file(&files.key)
            .map_err(|e| err("key", &files.key, e.to_string()))?;
        let ca_fingerprint = {
            use sha2::{Digest, Sha256};
            let mut h = Sha256::new();
            ca.iter().for_each(|c| h.update(c.as_ref()));
            h.finalize().iter().map(|b| format!("{b:02x}")).collect()
        };
        let mut roots = rustls::RootCertStore::empty();
        for c in ca {
            roots
                .add(c)
                .map_err(|e| err("ca", &files.ca, format!("not a usable CA certificate: {e}")))?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| err("ca", &files.ca, e.to_string()))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| err("cert", &files.cert, e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| {
                err(
                    "key",
                    &files.key,
                    format!("does not match the certificate: {e}"),
                )
            })?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| err("cert", &files.cert, e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| {
                err(
                    "key",
                    &files.key,
                    format!("does not match the certificate: {e}"),
                )
            })?;
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
            ca_fingerprint,
        })
    }
}

/// Accepts inbound connections for a TLS node: each handshake runs in a task of its own,
/// bounded by `timeout`, so a client that connects and stays silent cannot hold up the
/// others (ractor_cluster's own listener handshakes inline). Runs until aborted.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    server: ActorRef<NodeServerMessage>,
    acceptor: TlsAcceptor,
    timeout: Duration,
) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let local = tcp.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let (server, acceptor) = (server.clone(), acceptor.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let conn = Conn {
                        stream,
                        peer: peer.to_string(),
                        local,
                    };
                    let _ = server.cast(NodeServerMessage::ConnectionOpenedExternal {
                        stream: Box::new(conn),
                        is_server: true,
                    });
                }
                Ok(Err(e)) => tracing::warn!(
                    %peer,
                    error = %e,
                    "TLS handshake with an inbound connection failed; closed (a plain-text peer, or a certificate from another CA?)"
                ),
                Err(_) => {
                    tracing::warn!(%peer, ?timeout, "inbound connection sent no TLS handshake in time; closed")
                }
            }
        });
    }
}

/// Dials `peer` (TLS when `tls` is given, checking the peer's certificate names its host)
/// and hands the connection to `server`. `Ok` once connected; authentication follows.
pub async fn dial(
    server: &ActorRef<NodeServerMessage>,
    peer: &NodeAddr,
    gate: Arc<Gate>,
    tls: Option<&Tls>,
    timeout: Duration,
) -> Result<(), String> {
    if gate.fault() == LinkFault::Drop {
        return Err("link dropped by fault injection".into());
    }
    let connect = async {
        let tcp = TcpStream::connect((peer.host.as_str(), peer.port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let local = tcp.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let gated = Gated { inner: tcp, gate };
        let stream: Box<dyn ClusterBidiStream> = match tls {
            None => Box::new(Conn {
                stream: gated,
                peer: peer.to_string(),
                local,
            }),
            Some(tls) => {
                let name = ServerName::try_from(peer.host.clone())
                    .map_err(|e| format!("not a TLS server name: {e}"))?;
                let stream = tls
                    .connector
                    .connect(name, gated)
                    .await
                    .map_err(|e| format!("TLS handshake: {e}"))?;
                Box::new(Conn {
                    stream,
                    peer: peer.to_string(),
                    local,
                })
            }
        };
        Ok::<_, String>(stream)
    };
    let stream = tokio::time::timeout(timeout, connect)
        .await
        .map_err(|_| format!("no connection within {timeout:?}"))??;
    ractor_cluster::client_connect_external(server, stream)
        .await
        .map_err(|e| format!("node server: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_cut_gate_stalls_and_a_heal_resumes_without_loss() {
        let (a, mut b) = tokio::io::duplex(64);
        let gate = Arc::new(Gate::default());
        let mut gated = Gated {
            inner: a,
            gate: gate.clone(),
        };
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
        let mut gated = Gated {
            inner: a,
            gate: gate.clone(),
        };
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
}
