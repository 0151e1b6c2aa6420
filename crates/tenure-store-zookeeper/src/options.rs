//! Connection options, from a `store = "zookeeper"` lease section or built in code.

use std::time::Duration;

use tenure_lease::{ConfigError, LeaseSection};

/// This crate's fragment of the reference configuration: the options of a `store =
/// "zookeeper"` section (shown under `[lease.zookeeper]` in `config/reference.toml`).
pub const REFERENCE: &str = include_str!("../reference.toml");

/// The options of a `store = "zookeeper"` section as written (defaults: [`REFERENCE`]);
/// [`ZooKeeperOptions::from_section`] checks them.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ZooKeeperConfig {
    /// `connect`: `host:port[,host:port…][/chroot]`.
    pub connect: String,
    /// `root`: absolute path of the lease nodes.
    pub root: String,
    /// `session-timeout`; `None`: the section's `heartbeat-timeout`.
    #[serde(deserialize_with = "tenure_lease::duration::serde::optional")]
    pub session_timeout: Option<Duration>,
    /// `connection-timeout`; `None`: the section's `lease-operation-timeout`.
    #[serde(deserialize_with = "tenure_lease::duration::serde::optional")]
    pub connection_timeout: Option<Duration>,
    /// `auth`: `"scheme:credentials"`; `None`: no authentication.
    pub auth: Option<String>,
}

impl Default for ZooKeeperConfig {
    fn default() -> Self {
        ZooKeeperConfig {
            connect: "127.0.0.1:2181".into(),
            root: "/tenure/leases".into(),
            session_timeout: None,
            connection_timeout: None,
            auth: None,
        }
    }
}

impl std::fmt::Debug for ZooKeeperConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZooKeeperConfig")
            .field("connect", &self.connect)
            .field("root", &self.root)
            .field("session_timeout", &self.session_timeout)
            .field("connection_timeout", &self.connection_timeout)
            .finish_non_exhaustive()
    }
}

/// How to reach ZooKeeper and where to keep leases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZooKeeperOptions {
    /// `host:port[,host:port…][/chroot]`.
    pub connect: String,
    /// Absolute path under which lease nodes live (created when missing: without `auth`,
    /// with the layout that puts each family of leases under its own parent; an existing
    /// root keeps its layout).
    pub root: String,
    /// Session timeout to ask for. The server bounds it to [2, 20] × its tickTime (its
    /// `minSessionTimeout`/`maxSessionTimeout`); every acquire or renewal whose ttl exceeds
    /// the negotiated timeout fails (the server could end the session before the holder's
    /// deadline).
    pub session_timeout: Duration,
    /// Bound on establishing a session (and on each connection attempt).
    pub connection_timeout: Duration,
    /// `(scheme, credentials)` added to every session, e.g. `("digest", "user:password")`.
    /// With auth, nodes are created with the `creator_all` ACL.
    pub auth: Option<(String, Vec<u8>)>,
}

impl ZooKeeperOptions {
    /// Options with the given connect string and root, a session timeout of `ttl` and a
    /// connection timeout of 5 s, no auth.
    pub fn new(connect: impl Into<String>, root: impl Into<String>, ttl: Duration) -> Self {
        ZooKeeperOptions {
            connect: connect.into(),
            root: root.into(),
            session_timeout: ttl,
            connection_timeout: Duration::from_secs(5),
            auth: None,
        }
    }

    /// Reads and checks the options of a section ([`ZooKeeperConfig`]; keys it leaves out
    /// take their defaults). Errors name the offending key.
    pub fn from_section(section: &LeaseSection) -> Result<Self, ConfigError> {
        let c: ZooKeeperConfig = section.options()?;
        let key = |k: &str| format!("{}.{k}", section.key());
        if c.connect.trim().is_empty() {
            return Err(ConfigError::invalid(key("connect"), "must not be empty"));
        }
        check_root(&c.root).map_err(|e| ConfigError::invalid(key("root"), e.to_string()))?;
        // The store ttl is heartbeat-timeout plus any lock-delay: a crashed holder's session
        // must outlive both, or its grants would vanish before the delay is over.
        let store_ttl = section.settings.store_ttl();
        let session_timeout = c.session_timeout.unwrap_or(store_ttl);
        if session_timeout < store_ttl {
            return Err(ConfigError::invalid(
                key("session-timeout"),
                format!(
                    "{session_timeout:?} is below heartbeat-timeout plus lock-delay {store_ttl:?}: \
                     the server could end the session (and every lease of it) before a holder's \
                     deadline or before the lock-delay is over",
                ),
            ));
        }
        let auth = match c.auth {
            None => None,
            Some(text) => match text.split_once(':') {
                Some((scheme, cred)) if !scheme.is_empty() && !cred.is_empty() => {
                    Some((scheme.to_string(), cred.as_bytes().to_vec()))
                }
                _ => {
                    return Err(ConfigError::invalid(
                        key("auth"),
                        "expected \"scheme:credentials\", e.g. \"digest:user:password\"",
                    ));
                }
            },
        };
        Ok(ZooKeeperOptions {
            connect: c.connect,
            root: c.root,
            session_timeout,
            connection_timeout: c
                .connection_timeout
                .unwrap_or(section.settings.lease_operation_timeout),
            auth,
        })
    }
}

/// Why a `root` is no usable ZooKeeper path ([`check_root`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RootError {
    /// It does not start with `/`.
    #[error("{root:?} must be an absolute path (start with /)")]
    Relative { root: String },
    /// `/` itself, a trailing slash or a doubled one.
    #[error("{root:?} must name a node below / without a trailing or doubled slash")]
    NotANode { root: String },
    /// A segment `.` or `..`, or one with a control character.
    #[error("{root:?} has an invalid segment {segment:?}")]
    Segment { root: String, segment: String },
}

/// An absolute ZooKeeper path, not `/`, without a trailing or doubled slash, and no segment
/// `.`, `..` or with a control character: `Err` names the root and what is wrong.
pub(crate) fn check_root(root: &str) -> Result<(), RootError> {
    if !root.starts_with('/') {
        return Err(RootError::Relative {
            root: root.to_string(),
        });
    }
    if root.len() < 2 || root.ends_with('/') || root.contains("//") {
        return Err(RootError::NotANode {
            root: root.to_string(),
        });
    }
    if let Some(segment) = root
        .split('/')
        .skip(1)
        .find(|s| *s == "." || *s == ".." || s.chars().any(char::is_control))
    {
        return Err(RootError::Segment {
            root: root.to_string(),
            segment: segment.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_lease::TenureConfig;

    #[test]
    fn the_reference_fragment_is_the_defaults() {
        let c: ZooKeeperConfig = toml::from_str(REFERENCE).unwrap();
        assert_eq!(c, ZooKeeperConfig::default());
    }

    #[test]
    fn reference_section_reads() {
        let c = TenureConfig::reference();
        let s = c.lease_section("zookeeper").unwrap();
        let o = ZooKeeperOptions::from_section(&s).unwrap();
        assert_eq!(o.session_timeout, s.settings.heartbeat_timeout);
        assert_eq!(o.connection_timeout, s.settings.lease_operation_timeout);
        assert_eq!(o.auth, None);
    }

    #[test]
    fn a_section_of_its_own_takes_the_reference_defaults() {
        let c = TenureConfig::from_toml_str(
            "[lease.zk]\nstore = \"zookeeper\"\nconnect = \"127.0.0.1:22181\"\n\
             heartbeat-timeout = \"4s\"\nheartbeat-interval = \"1s\"\n",
            "t",
        )
        .unwrap();
        let o = ZooKeeperOptions::from_section(&c.lease_section("zk").unwrap()).unwrap();
        let reference = ZooKeeperOptions::from_section(
            &TenureConfig::reference()
                .lease_section("zookeeper")
                .unwrap(),
        )
        .unwrap();
        assert_eq!(o.connect, "127.0.0.1:22181");
        assert_eq!(o.root, reference.root);
        assert_eq!(o.session_timeout, Duration::from_secs(4));
    }

    #[test]
    fn bad_options_name_the_key() {
        let bad = [
            ("root = \"tenure\"", "lease.z.root"),
            ("root = \"/a/\"", "lease.z.root"),
            ("connect = \"\"", "lease.z.connect"),
            ("auth = \"digest\"", "lease.z.auth"),
            ("session-timeout = \"1s\"", "lease.z.session-timeout"),
            ("conect = \"x\"", "`lease.z.conect`"),
            ("session-timeout = \"0s\"", "lease.z.session-timeout"),
            ("auth = \"\"", "lease.z.auth"),
        ];
        for (line, key) in bad {
            let text = "[lease.z]\nstore = \"zookeeper\"\nconnect = \"127.0.0.1:2181\"\nroot = \"/t\"\n\
                 session-timeout = \"10s\"\nconnection-timeout = \"2s\"\nauth = \"digest:u:p\"\n\
                 heartbeat-timeout = \"10s\"\nheartbeat-interval = \"1s\"\n";
            let text = text
                .lines()
                .filter(|l| {
                    line.split_once(" =")
                        .is_none_or(|(k, _)| !l.starts_with(&format!("{k} =")))
                })
                .collect::<Vec<_>>()
                .join("\n")
                + "\n"
                + line;
            let c = TenureConfig::from_toml_str(&text, "t").unwrap();
            let err = ZooKeeperOptions::from_section(&c.lease_section("z").unwrap())
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{line}: {err}");
        }
    }

    #[test]
    fn a_bad_root_names_what_is_wrong() {
        let relative = |r: &str| RootError::Relative { root: r.into() };
        let not_a_node = |r: &str| RootError::NotANode { root: r.into() };
        let segment = |r: &str, s: &str| RootError::Segment {
            root: r.into(),
            segment: s.into(),
        };
        for (root, expected) in [
            ("tenure", relative("tenure")),
            ("/", not_a_node("/")),
            ("/a/", not_a_node("/a/")),
            ("/a//b", not_a_node("/a//b")),
            ("/a/../b", segment("/a/../b", "..")),
            ("/a/./b", segment("/a/./b", ".")),
            ("/a/b\u{7}", segment("/a/b\u{7}", "b\u{7}")),
        ] {
            assert_eq!(check_root(root), Err(expected), "{root:?}");
        }
        assert_eq!(check_root("/tenure/leases"), Ok(()));
        assert_eq!(
            check_root("/a/../b").unwrap_err().to_string(),
            "\"/a/../b\" has an invalid segment \"..\""
        );
    }
}
