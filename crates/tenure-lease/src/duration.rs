//! Durations read from configuration, flags and stores: one bound and one parser, so that
//! no duration a user writes can overflow instant arithmetic.

use std::time::Duration;

use tokio::time::Instant;

/// Longest accepted duration: far beyond any sensible lease, far below clock overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses a duration such as `"5s"`, `"250ms"` or `"1h 30m"`; the error says what was wrong,
/// including a duration longer than [`MAX_DURATION`] (365 days). Usable as a clap
/// `value_parser`.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let d = humantime::parse_duration(text).map_err(|source| DurationError::Unparsable {
        text: text.to_owned(),
        source,
    })?;
    if d > MAX_DURATION {
        return Err(DurationError::TooLong {
            text: text.to_owned(),
            duration: d,
        });
    }
    Ok(d)
}

/// `Ok` unless `d` is longer than [`MAX_DURATION`]; the error says so.
pub fn check(d: Duration) -> Result<(), DurationError> {
    if d > MAX_DURATION {
        return Err(DurationError::TooLong {
            text: humantime::format_duration(d).to_string(),
            duration: d,
        });
    }
    Ok(())
}

/// Why a duration was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DurationError {
    /// The text is no duration humantime reads (`"5s"`, `"250ms"`, `"1h 30m"`).
    #[error("invalid duration {text:?}: {source}")]
    Unparsable {
        /// The text given.
        text: String,
        /// What the parser found wrong.
        #[source]
        source: humantime::DurationError,
    },
    /// The duration is longer than [`MAX_DURATION`].
    #[error("duration {text:?} is longer than the maximum of 365 days")]
    TooLong {
        /// The duration as given (or as formatted, when it came as a number).
        text: String,
        /// The duration.
        duration: Duration,
    },
}

/// `at + d`, with `d` capped at [`MAX_DURATION`]: for durations that come from elsewhere (a
/// store record), where "practically never" is the right reading of an absurd value.
pub fn later(at: Instant, d: Duration) -> Instant {
    at + d.min(MAX_DURATION)
}

/// Serde support for durations in configuration, with the text and bound of [`parse`]:
/// `#[serde(deserialize_with = "tenure_lease::duration::serde::required")]` and friends.
pub mod serde {
    use std::time::Duration;

    use ::serde::de::Error;
    use ::serde::{Deserialize, Deserializer};

    /// A duration such as `"1500ms"`, `"2s"` or `"1m 30s"`, at most 365 days.
    pub fn required<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d).map_err(|_| {
            D::Error::custom("expected a duration string such as \"5s\" or \"1m 30s\"")
        })?;
        super::parse(&text).map_err(D::Error::custom)
    }

    /// As [`required`], and not zero.
    pub fn positive<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        match required(d)? {
            d if d.is_zero() => Err(D::Error::custom("must be > 0")),
            d => Ok(d),
        }
    }

    /// An optional positive duration (with `#[serde(default)]`: absent is `None`). Zero is
    /// refused: it once meant "the default", which leaving the key out now says.
    pub fn optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        match required(d)? {
            d if d.is_zero() => Err(D::Error::custom(
                "must be > 0 (leave the key out rather than set it to \"0s\")",
            )),
            d => Ok(Some(d)),
        }
    }

    /// A positive duration, or `"off"` (`None`).
    pub fn or_off<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(d).map_err(|_| {
            D::Error::custom("expected \"off\" or a duration string such as \"5s\"")
        })?;
        if text == "off" {
            return Ok(None);
        }
        match super::parse(&text).map_err(D::Error::custom)? {
            d if d.is_zero() => Err(D::Error::custom("must be > 0, or \"off\"")),
            d => Ok(Some(d)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_beyond_a_year_are_refused_with_the_text() {
        assert_eq!(parse("90s"), Ok(Duration::from_secs(90)));
        let err = parse("584542046090years").unwrap_err();
        assert!(
            matches!(&err, DurationError::TooLong { text, .. } if text == "584542046090years"),
            "{err:?}"
        );
        assert!(err.to_string().contains("365 days"), "{err}");
        let err = parse("soon").unwrap_err();
        assert!(
            matches!(&err, DurationError::Unparsable { text, .. } if text == "soon"),
            "{err:?}"
        );
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn later_never_overflows() {
        let now = Instant::now();
        assert_eq!(later(now, Duration::MAX), now + MAX_DURATION);
    }
}
