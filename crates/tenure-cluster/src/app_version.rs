//! The application version a node runs (`cluster.app-version`), for rolling updates: the
//! shard coordinator gives new and moved shards to the newest version present, and the
//! singleton prefers the oldest node of the newest version.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

/// An application version: any string, ordered as semantic versions when both sides parse
/// as one (`MAJOR.MINOR.PATCH`, an optional `-pre-release`, an optional `+build` that is
/// ignored), else as strings (byte order). So `1.10.0` is newer than `1.9.0`, `2.0.0` than
/// `2.0.0-rc.1`, and `2026-11-28` than `2026-11-27`. Versions that compare equal (`1.0.0`
/// and `1.0.0+b7`) are the same version for placement.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AppVersion(String);

/// The version of a node that sets none (`cluster.app-version`'s default).
pub const DEFAULT_APP_VERSION: &str = "0.0.0";

impl Default for AppVersion {
    fn default() -> Self {
        AppVersion(DEFAULT_APP_VERSION.to_string())
    }
}

impl AppVersion {
    /// The version `text`, as written.
    pub fn new(text: impl Into<String>) -> Self {
        AppVersion(text.into())
    }

    /// The version as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for AppVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Ord for AppVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        match (Semver::parse(&self.0), Semver::parse(&other.0)) {
            (Some(a), Some(b)) => a.cmp(&b),
            _ => self.0.cmp(&other.0),
        }
    }
}

impl PartialOrd for AppVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for AppVersion {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for AppVersion {}

/// A semantic version, ordered by semver precedence.
#[derive(Debug, PartialEq, Eq)]
struct Semver<'a> {
    core: [u64; 3],
    /// Dot-separated pre-release identifiers (empty: a release).
    pre: Vec<&'a str>,
}

impl<'a> Semver<'a> {
    fn parse(text: &'a str) -> Option<Semver<'a>> {
        let text = text.split_once('+').map_or(text, |(v, _build)| v);
        let (core, pre) = match text.split_once('-') {
            Some((core, pre)) => (core, pre.split('.').collect::<Vec<_>>()),
            None => (text, Vec::new()),
        };
        if pre
            .iter()
            .any(|id| id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        {
            return None;
        }
        let mut parts = core.split('.');
        let mut number = || -> Option<u64> {
            let part = parts.next()?;
            let leading_zero = part.len() > 1 && part.starts_with('0');
            if part.is_empty() || leading_zero || !part.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            part.parse().ok()
        };
        let core = [number()?, number()?, number()?];
        if parts.next().is_some() {
            return None;
        }
        Some(Semver { core, pre })
    }
}

impl Ord for Semver<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.core.cmp(&other.core).then_with(|| {
            match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                // A pre-release comes before its release.
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => {
                    for (a, b) in self.pre.iter().zip(&other.pre) {
                        let order = match (a.parse::<u64>(), b.parse::<u64>()) {
                            (Ok(a), Ok(b)) => a.cmp(&b),
                            (Ok(_), Err(_)) => Ordering::Less,
                            (Err(_), Ok(_)) => Ordering::Greater,
                            (Err(_), Err(_)) => a.cmp(b),
                        };
                        if order != Ordering::Equal {
                            return order;
                        }
                    }
                    self.pre.len().cmp(&other.pre.len())
                }
            }
        })
    }
}

impl PartialOrd for Semver<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> AppVersion {
        AppVersion::new(s)
    }

    #[test]
    fn semantic_versions_compare_by_precedence() {
        assert!(v("1.10.0") > v("1.9.0"), "numerically, not as text");
        assert!(
            v("2.0.0") > v("2.0.0-rc.1"),
            "a release after its pre-releases"
        );
        assert!(v("2.0.0-rc.10") > v("2.0.0-rc.9"));
        assert!(v("2.0.0-rc.1") > v("2.0.0-alpha"));
        assert!(
            v("1.0.0-alpha.1") > v("1.0.0-alpha"),
            "more identifiers win"
        );
        assert!(
            v("1.0.0-alpha.beta") > v("1.0.0-alpha.1"),
            "words after numbers"
        );
        assert_eq!(v("1.0.0+build.7"), v("1.0.0"), "build metadata is ignored");
    }

    #[test]
    fn other_strings_compare_as_text() {
        assert!(v("2026-11-28") > v("2026-11-27"));
        assert!(v("b") > v("a"));
        // One side not a semver: text order, so "10" < "9".
        assert!(v("9") > v("10"));
        assert!(v("1.2") > v("1.10"), "not a semver (two parts): text order");
        assert!(
            v("01.0.0") > v("0.9.0"),
            "a leading zero is no semver: text order"
        );
        assert_eq!(AppVersion::default().as_str(), "0.0.0");
    }
}
