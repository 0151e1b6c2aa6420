//! Who a node is: its cluster address `host:port` (also its lease owner name) and an
//! incarnation id that changes on every start.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::error::ClusterError;

/// A node's cluster address, `host:port`, as configured and as peers dial it. It is also
/// the owner name of every lease the node holds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodeAddr {
    /// The host name or IP address.
    pub host: String,
    /// The TCP port.
    pub port: u16,
}

impl NodeAddr {
    /// Parses `host:port` (`key` names the config key or flag in the error). The host is an
    /// IP address or a DNS name; the port must not be 0. `Err(ClusterError::Address)`
    /// names the key, the text and the [`AddressProblem`].
    pub fn parse(key: &str, text: &str) -> Result<NodeAddr, ClusterError> {
        let bad = |problem: AddressProblem| ClusterError::Address {
            key: key.to_string(),
            value: text.to_string(),
            problem,
        };
        let (host, port) = match text.parse::<SocketAddr>() {
            Ok(sa) => (sa.ip().to_string(), sa.port()),
            Err(_) => {
                let (host, port) = text
                    .rsplit_once(':')
                    .ok_or_else(|| bad(AddressProblem::NoPort))?;
                let port: u16 = port.parse().map_err(|source| {
                    bad(AddressProblem::Port {
                        port: port.to_string(),
                        source,
                    })
                })?;
                (host.to_string(), port)
            }
        };
        if port == 0 {
            return Err(bad(AddressProblem::PortZero));
        }
        check_host(&host).map_err(bad)?;
        Ok(NodeAddr { host, port })
    }

    /// The address with a parsed IP host, when the host is an IP address.
    pub fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }
}

impl TryFrom<String> for NodeAddr {
    type Error = ClusterError;
    fn try_from(text: String) -> Result<Self, ClusterError> {
        NodeAddr::parse("node address", &text)
    }
}

impl From<NodeAddr> for String {
    fn from(addr: NodeAddr) -> String {
        addr.to_string()
    }
}

/// What is wrong with a node address ([`NodeAddr::parse`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddressProblem {
    /// No `:port` after the host.
    #[error("expected host:port")]
    NoPort,
    /// The port is not a number from 0 to 65535.
    #[error("the port {port:?} must be a number from 1 to 65535")]
    Port {
        /// The port as given.
        port: String,
        /// The parser's error.
        #[source]
        source: std::num::ParseIntError,
    },
    /// Port 0: peers could not dial it.
    #[error("the port must not be 0 (peers must know where to dial)")]
    PortZero,
    /// The host is neither an IP address nor a DNS name.
    #[error("{host:?} is neither an IP address nor a host name")]
    Host {
        /// The host as given.
        host: String,
    },
}

/// A host must be an IP address or a DNS name (letters, digits, `-`, `.`).
pub(crate) fn check_host(host: &str) -> Result<(), AddressProblem> {
    if host.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    let ok = !host.is_empty()
        && host.len() <= 253
        && host
            .split('.')
            .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    if ok {
        Ok(())
    } else {
        Err(AddressProblem::Host {
            host: host.to_string(),
        })
    }
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip() {
            Some(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            _ => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

/// One life of a node process: a fresh id at every start, so that a restarted node (same
/// `host:port`) is never taken for its previous life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Incarnation(pub u64);

impl Incarnation {
    /// A new incarnation id: wall-clock nanoseconds mixed with the pid and random bits.
    pub fn new() -> Incarnation {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default();
        let pid = u64::from(std::process::id());
        Incarnation(nanos ^ pid.rotate_left(40) ^ fastrand::u64(..) >> 24)
    }
}

impl Default for Incarnation {
    fn default() -> Self {
        Incarnation::new()
    }
}

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ip_and_names() {
        let a = NodeAddr::parse("k", "127.0.0.1:4701").unwrap();
        assert_eq!(
            (a.host.as_str(), a.port, a.to_string()),
            ("127.0.0.1", 4701, "127.0.0.1:4701".into())
        );
        let b = NodeAddr::parse("k", "node-1.example:80").unwrap();
        assert_eq!(b.to_string(), "node-1.example:80");
        let c = NodeAddr::parse("k", "[::1]:9").unwrap();
        assert_eq!(c.to_string(), "[::1]:9");
    }

    #[test]
    fn rejects_bad_addresses_naming_the_key_and_the_problem() {
        let port = |p: &str| AddressProblem::Port {
            port: p.to_string(),
            source: p.parse::<u16>().unwrap_err(),
        };
        let host = |h: &str| AddressProblem::Host {
            host: h.to_string(),
        };
        for (bad, expected) in [
            ("127.0.0.1", AddressProblem::NoPort),
            ("127.0.0.1:0", AddressProblem::PortZero),
            ("host:99999", port("99999")),
            ("bad host:1", host("bad host")),
            (":1", host("")),
            ("a..b:1", host("a..b")),
        ] {
            let err = NodeAddr::parse("cluster.seeds[0]", bad).unwrap_err();
            let ClusterError::Address { problem, .. } = &err else {
                panic!("not an address error: {err}");
            };
            assert_eq!(problem, &expected, "{bad}");
            let text = err.to_string();
            assert!(
                text.contains("cluster.seeds[0]") && text.contains(bad),
                "{text}"
            );
        }
        let err = NodeAddr::parse("cluster.seeds[0]", "host:99999").unwrap_err();
        assert!(
            std::error::Error::source(&err)
                .and_then(std::error::Error::source)
                .is_some_and(|s| s.is::<std::num::ParseIntError>()),
            "{err:?}"
        );
    }

    #[test]
    fn incarnations_differ() {
        assert_ne!(Incarnation::new(), Incarnation::new());
    }
}
