//! The shape layer: YAML text to [`Config`], with serde_path_to_error
//! tracking where the parser is so every type error carries its path, and
//! a nesting budget so a deep file cannot overflow the stack; and loading,
//! a file or text through both layers ([`Config::load`],
//! [`Config::from_yaml`]).

use std::path::Path;

use serde::Deserialize;

use super::{Config, ConfigError};

/// The deepest YAML nesting a configuration file may have.
pub const MAX_NESTING: usize = 32;

impl Config {
    /// Parses and validates a configuration from YAML text.
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        let config = parse(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and validates a configuration file. Errors name the file
    /// and the field.
    pub fn load(file: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let file = file.as_ref();
        let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
            file: file.to_owned(),
            source,
        })?;
        Config::from_yaml(&text).map_err(|e| e.in_file(file))
    }
}

/// YAML → [`Config`] with path tracking, no semantic checks.
fn parse(text: &str) -> Result<Config, ConfigError> {
    let mut track = serde_path_to_error::Track::new();
    // Real files nest about a dozen levels. The parser's default depth
    // budget (64) is more than a 2 MiB thread stack (a test thread, a
    // tokio worker) can deserialize into nested checker expressions in a
    // debug build, about 32 KiB per level: refuse at MAX_NESTING instead
    // of overflowing the stack (docs/reliability.md).
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = MAX_NESTING;
    let options = serde_saphyr::options! { with_snippet: false, budget: Some(budget) };
    let result = serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
        Config::deserialize(serde_path_to_error::Deserializer::new(de, &mut track))
    });
    result.map_err(|err| {
        let location = err.location().filter(|l| l.line() > 0);
        ConfigError::Invalid {
            file: None,
            path: tidy_path(&track.path().to_string()),
            message: saphyr_message(&err),
            line: location.map(|l| l.line()),
            column: location.map(|l| l.column()),
        }
    })
}

/// serde_path_to_error writes `?` for a map key it has not read yet (e.g.
/// a duplicate key); the enclosing map is the useful path then.
pub(super) fn tidy_path(path: &str) -> String {
    let trimmed = path
        .strip_suffix(".?")
        .or_else(|| path.strip_suffix('?'))
        .unwrap_or(path);
    if trimmed.is_empty() {
        ".".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// The parser's message in our words where its own are about its internals,
/// without its location suffix (we print ours).
fn saphyr_message(err: &serde_saphyr::Error) -> String {
    use serde_saphyr::Error as E;
    match err.without_snippet() {
        E::ExpectedMappingEndAfterEnumVariantValue { .. } => {
            return "this map must have exactly one key".to_owned();
        }
        E::ExternallyTaggedEnumExpectedScalarOrMapping { .. } => {
            return "expected a word (e.g. podReady) or a map with exactly one key".to_owned();
        }
        _ => {}
    }
    let text = err.without_snippet().to_string();
    let text = text
        .rfind(" at line ")
        .map_or(text.as_str(), |i| &text[..i]);
    text.replace(", set DuplicateKeyPolicy in Options if acceptable", "")
}
