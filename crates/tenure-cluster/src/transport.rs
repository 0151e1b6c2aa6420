//! Connections between nodes: outbound dials (plain or TLS), the TLS configuration, and
//! the heartbeat datagrams ([`datagram`]). With the `fault-injection` feature, dials go
//! through a per-peer [`Gate`] (see [`gate`]) that stalls or drops traffic on a test's
//! request; the same gate holds back the heartbeat datagrams of that peer.
//!
//! Every session between two Tenure nodes starts as a dial by one of them, and ractor keeps
//! one session per pair; so a fault set on *both* nodes reaches whichever connection
//! survived: to lose what A sends B, stall A's outbound and B's inbound traffic. Datagrams
//! are gated where they are sent and where they arrive, so the same pair of faults loses
//! them too.

use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;
use ractor_cluster::{BoxRead, BoxWrite, ClusterBidiStream, NodeServerMessage};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::error::ClusterError;
use crate::identity::NodeAddr;
use crate::settings::TlsFiles;

pub mod datagram;
#[cfg(feature = "fault-injection")]
pub mod gate;
#[cfg(feature = "fault-injection")]
pub use gate::{Gate, Gated, Links};

/// What fault injection does to this node's traffic with one peer: its session (TCP) and
/// its heartbeat datagrams alike, except [`LinkFault::StallSession`]. A stalled datagram is
/// not delivered (datagrams are not held back for later: a late heartbeat is no news).
/// Part of the protocol whatever the features (a node built without `fault-injection`
/// refuses every fault).
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
    /// The sessions open now stall both ways while heartbeat datagrams flow and new
    /// connections work: TCP streams stuck behind data or in a middlebox (tests that
    /// heartbeats do not queue behind them, and that stuck sessions are replaced).
    StallSession,
}

impl LinkFault {
    /// Its name in `tenure cluster fault --mode` and in histories.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkFault::None => "none",
            LinkFault::Stall => "stall",
            LinkFault::StallInbound => "inbound",
            LinkFault::StallOutbound => "outbound",
            LinkFault::Drop => "drop",
            LinkFault::StallSession => "session",
        }
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
    /// Accepts peers' TLS connections, requiring a client certificate from the CA.
    pub acceptor: TlsAcceptor,
    /// Dials peers over TLS, presenting this node's certificate.
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
        // Both sides refuse the same files for the same reasons.
        let no_protocol = |e: rustls::Error| err("cert", &files.cert, e.to_string());
        let key_mismatch = |e: rustls::Error| {
            err(
                "key",
                &files.key,
                format!("does not match the certificate: {e}"),
            )
        };
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(no_protocol)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(key_mismatch)?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(no_protocol)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(key_mismatch)?;
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

/// Why a dial to a peer did not hand a connection to the node server; names the peer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DialError {
    /// The TCP connection failed (refused, unreachable, the host did not resolve).
    #[error("connect to {peer}: {source}")]
    Connect {
        /// The peer dialled (`host:port`).
        peer: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The peer's host is not a name or address TLS can check a certificate against.
    #[error("{peer}: not a TLS server name: {source}")]
    ServerName {
        /// The peer dialled (`host:port`).
        peer: String,
        /// Why the host is not a server name.
        #[source]
        source: rustls_pki_types::InvalidDnsNameError,
    },
    /// The TLS handshake failed (untrusted or mismatched certificate, not a TLS peer).
    #[error("TLS handshake with {peer}: {source}")]
    Tls {
        /// The peer dialled (`host:port`).
        peer: String,
        /// The handshake's error.
        #[source]
        source: std::io::Error,
    },
    /// No connection (TCP and TLS) within the dial timeout.
    #[error("no connection to {peer} within {timeout:?}")]
    TimedOut {
        /// The peer dialled (`host:port`).
        peer: String,
        /// The dial timeout (`cluster.dial-timeout`).
        timeout: Duration,
    },
    /// The link to the peer is dropped by fault injection.
    #[error("link to {peer} dropped by fault injection")]
    Dropped {
        /// The peer dialled (`host:port`).
        peer: String,
    },
    /// The node server did not take the connection (it has stopped).
    #[error("node server, connecting {peer}: {detail}")]
    Server {
        /// The peer dialled (`host:port`).
        peer: String,
        /// The node server's answer.
        detail: String,
    },
}

/// Dials `peer` (TLS when `tls` is given, checking the peer's certificate names its host)
/// and hands the connection to `server`. `Ok` once connected; authentication follows.
/// `Err` names the peer and what failed.
pub async fn dial(
    server: &ActorRef<NodeServerMessage>,
    peer: &NodeAddr,
    tls: Option<&Tls>,
    timeout: Duration,
) -> Result<(), DialError> {
    dial_through(server, peer, tls, timeout, |tcp| tcp).await
}

/// [`dial`] through `gate`: refused while the link is dropped, stalled while it is cut.
#[cfg(feature = "fault-injection")]
pub async fn dial_gated(
    server: &ActorRef<NodeServerMessage>,
    peer: &NodeAddr,
    gate: Arc<Gate>,
    tls: Option<&Tls>,
    timeout: Duration,
) -> Result<(), DialError> {
    if gate.fault() == LinkFault::Drop {
        return Err(DialError::Dropped {
            peer: peer.to_string(),
        });
    }
    dial_through(server, peer, tls, timeout, |tcp| gate.wrap(tcp)).await
}

/// Connects to `peer`, wraps the TCP stream with `wrap`, then TLS when given.
async fn dial_through<S>(
    server: &ActorRef<NodeServerMessage>,
    peer: &NodeAddr,
    tls: Option<&Tls>,
    timeout: Duration,
    wrap: impl FnOnce(TcpStream) -> S,
) -> Result<(), DialError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let connect = async {
        let connect_err = |source| DialError::Connect {
            peer: peer.to_string(),
            source,
        };
        let tcp = TcpStream::connect((peer.host.as_str(), peer.port))
            .await
            .map_err(connect_err)?;
        tcp.set_nodelay(true).map_err(connect_err)?;
        let local = tcp.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let wrapped = wrap(tcp);
        let stream: Box<dyn ClusterBidiStream> = match tls {
            None => Box::new(Conn {
                stream: wrapped,
                peer: peer.to_string(),
                local,
            }),
            Some(tls) => {
                let name = ServerName::try_from(peer.host.clone()).map_err(|source| {
                    DialError::ServerName {
                        peer: peer.to_string(),
                        source,
                    }
                })?;
                let stream = tls
                    .connector
                    .connect(name, wrapped)
                    .await
                    .map_err(|source| DialError::Tls {
                        peer: peer.to_string(),
                        source,
                    })?;
                Box::new(Conn {
                    stream,
                    peer: peer.to_string(),
                    local,
                })
            }
        };
        Ok::<_, DialError>(stream)
    };
    let stream =
        tokio::time::timeout(timeout, connect)
            .await
            .map_err(|_| DialError::TimedOut {
                peer: peer.to_string(),
                timeout,
            })??;
    ractor_cluster::client_connect_external(server, stream)
        .await
        .map_err(|e| DialError::Server {
            peer: peer.to_string(),
            detail: e.to_string(),
        })
}
