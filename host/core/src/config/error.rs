//! [`ConfigError`]: what loading a configuration reports, with the path of
//! the offending field and, when the parser knows it, its line and column.
//!
//! Its own module because both layers (`parse` and `validate`) produce it
//! and the schema's entry points return it.

use std::{
    fmt,
    path::{Path, PathBuf},
};

/// A problem found in a configuration, with the path of the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {}: {source}", file.display())]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}", DisplayInvalid(self))]
    Invalid {
        /// The file, when loaded with [`Config::load`](super::Config::load).
        file: Option<PathBuf>,
        /// `membership.perPort.ports.http.httpGet.timeout`; `.` for the root.
        path: String,
        message: String,
        /// 1-based position in the YAML text, when the parser knows it.
        line: Option<u64>,
        column: Option<u64>,
    },
}

impl ConfigError {
    /// The path of the offending field, if the error is about one.
    pub fn field_path(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { path, .. } => Some(path),
            ConfigError::Read { .. } => None,
        }
    }

    pub(super) fn in_file(self, name: &Path) -> Self {
        match self {
            ConfigError::Invalid {
                path,
                message,
                line,
                column,
                ..
            } => ConfigError::Invalid {
                file: Some(name.to_owned()),
                path,
                message,
                line,
                column,
            },
            other => other,
        }
    }
}

struct DisplayInvalid<'a>(&'a ConfigError);

impl fmt::Display for DisplayInvalid<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ConfigError::Invalid {
            file,
            path,
            message,
            line,
            column,
        } = self.0
        else {
            return Ok(());
        };
        if let Some(file) = file {
            write!(f, "{}: ", file.display())?;
        }
        write!(f, "{path}: {message}")?;
        match (line, column) {
            (Some(l), Some(c)) => write!(f, " (line {l}, column {c})"),
            (Some(l), None) => write!(f, " (line {l})"),
            _ => Ok(()),
        }
    }
}
