//! Durations in the file are humantime strings (`500ms`, `1s`, `2m`): the
//! `#[serde(with = ...)]` helpers of the schema's `Duration` fields.
//!
//! Apart from the schema because they are serde plumbing, not part of the
//! file's model; their error text (`invalid duration "1x": ...`) is what a
//! user sees for a bad duration.

/// Optional humantime durations.
pub(super) mod duration_opt {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        #[derive(Deserialize)]
        struct Wrapped(#[serde(with = "super::duration_str")] Duration);
        Ok(Option::<Wrapped>::deserialize(d)?.map(|Wrapped(d)| d))
    }
}

/// Durations as humantime strings (`500ms`, `1s`, `2m`).
pub(super) mod duration_str {
    use std::{fmt, time::Duration};

    use serde::de::{self, Deserializer, Visitor};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Duration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as 500ms, 1s or 2m")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Duration, E> {
                humantime::parse_duration(s.trim())
                    .map_err(|e| E::custom(format!("invalid duration {s:?}: {e}")))
            }
        }
        d.deserialize_str(V)
    }
}

/// [`duration_str`] for an optional field (absent: `None`).
pub(super) mod optional_duration_str {
    use std::time::Duration;

    use serde::de::Deserializer;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        super::duration_str::deserialize(d).map(Some)
    }
}
