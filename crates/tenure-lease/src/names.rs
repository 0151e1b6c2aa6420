//! Lease and owner names, with Akka's conventions, and sanitisation for stores that cannot
//! hold a name verbatim.

use sha2::{Digest, Sha256};

use crate::error::ConfigError;

/// The owner name of a cluster node: its `host:port`.
pub fn owner(host: &str, port: u16) -> String {
    format!("{host}:{port}")
}

/// `<system>-singleton-<singleton name>`.
pub fn singleton_lease(system: &str, singleton: &str) -> String {
    format!("{system}-singleton-{singleton}")
}

/// `<system>-shard-<type name>-<shard id>`.
pub fn shard_lease(system: &str, type_name: &str, shard_id: &str) -> String {
    format!("{system}-shard-{type_name}-{shard_id}")
}

/// The least string above every string that starts with `prefix`, in byte order of UTF-8
/// (which is code point order: SQLite's `BINARY`, PostgreSQL's `C` collation): `prefix` with its last character that
/// has a successor replaced by that successor and what follows it dropped. `None` when no
/// character has one (the empty prefix, or only U+10FFFF): then nothing bounds the names.
pub fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        // The next scalar value: surrogates are no characters, so U+D7FF is followed by
        // U+E000.
        let next = match u32::from(last) {
            0xD7FF => Some('\u{E000}'),
            c => char::from_u32(c + 1),
        };
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Checks a lease name as a user gave it: non-empty, no control characters.
pub fn check_lease_name(name: &str) -> Result<(), ConfigError> {
    if name.is_empty() {
        return Err(ConfigError::LeaseName {
            name: name.into(),
            detail: "must not be empty".into(),
        });
    }
    if name.chars().any(char::is_control) {
        return Err(ConfigError::LeaseName {
            name: name.escape_debug().to_string(),
            detail: "must not contain control characters".into(),
        });
    }
    Ok(())
}

/// Checks a name component such as a system name (`key` names it in the error).
pub fn check_component(key: &str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() || value.chars().any(char::is_control) {
        return Err(ConfigError::invalid(
            key,
            format!("{value:?} must be non-empty without control characters"),
        ));
    }
    Ok(())
}

/// What lease names a store can hold verbatim.
#[derive(Debug, Clone, Copy)]
pub struct NameRules {
    /// Longest name in bytes.
    pub max_len: usize,
    /// Whether a character may appear in a name.
    pub allowed: fn(char) -> bool,
}

impl Default for NameRules {
    /// Any printable name up to 512 bytes.
    fn default() -> Self {
        NameRules {
            max_len: 512,
            allowed: |c| !c.is_control(),
        }
    }
}

const HASH_HEX: usize = 16;
const SEPARATORS: [char; 4] = ['~', '_', '-', '.'];

/// The name under which a store holds lease `name`: the name itself when the store can
/// hold it verbatim, otherwise its allowed characters (others replaced by `_`), cut to fit,
/// then `~` and 16 hex digits of the SHA-256 of the original name. Deterministic, so
/// every node maps a name alike; the hash keeps distinct names distinct. A name that
/// already has the shape of a sanitised name is hashed too, so it cannot alias one.
pub fn store_name(name: &str, rules: &NameRules) -> String {
    let verbatim =
        name.len() <= rules.max_len && name.chars().all(rules.allowed) && !looks_sanitised(name);
    if verbatim {
        return name.to_string();
    }
    let digest = Sha256::digest(name.as_bytes());
    let hash: String = digest[..HASH_HEX / 2]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let pick = |options: &[char]| options.iter().copied().find(|c| (rules.allowed)(*c));
    let sep = pick(&SEPARATORS).unwrap_or('x');
    let filler = pick(&['_', '-', '.']).unwrap_or('x');
    let budget = rules.max_len.saturating_sub(HASH_HEX + 1);
    let mut out = String::new();
    for c in name.chars() {
        let c = if (rules.allowed)(c) { c } else { filler };
        if out.len() + c.len_utf8() > budget {
            break;
        }
        out.push(c);
    }
    out.push(sep);
    out.push_str(&hash);
    out
}

fn looks_sanitised(name: &str) -> bool {
    let bytes = name.as_bytes();
    bytes.len() > HASH_HEX
        && (SEPARATORS.contains(&char::from(bytes[bytes.len() - HASH_HEX - 1]))
            || bytes[bytes.len() - HASH_HEX - 1] == b'x')
        && bytes[bytes.len() - HASH_HEX..]
            .iter()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn akka_names() {
        assert_eq!(owner("10.0.0.1", 2552), "10.0.0.1:2552");
        assert_eq!(singleton_lease("sys", "coord"), "sys-singleton-coord");
        assert_eq!(shard_lease("sys", "counter", "17"), "sys-shard-counter-17");
    }

    #[test]
    fn sanitising_is_deterministic_and_collision_free() {
        let rules = NameRules {
            max_len: 40,
            allowed: |c| c.is_ascii_alphanumeric() || c == '-',
        };
        assert_eq!(store_name("plain-name", &rules), "plain-name");
        let a = store_name("a/b", &rules);
        let b = store_name("a_b", &rules);
        let c = store_name("a.b", &rules);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a, store_name("a/b", &rules));
        let long1 = store_name(&"x".repeat(100), &rules);
        let long2 = store_name(&"x".repeat(101), &rules);
        assert_ne!(long1, long2);
        assert!(
            long1.len() <= 40 && long1.chars().all(rules.allowed),
            "{long1}"
        );
        // A verbatim name shaped like a sanitised one is hashed too.
        let shaped = format!("a_{}", &a[a.len() - 16..]);
        assert_ne!(store_name(&shaped, &rules), shaped);
    }

    #[test]
    fn empty_and_control_names_are_rejected() {
        assert!(
            check_lease_name("")
                .unwrap_err()
                .to_string()
                .contains("must not be empty")
        );
        assert!(check_lease_name("a\nb").is_err());
        assert!(check_lease_name("ok-name").is_ok());
    }
}
