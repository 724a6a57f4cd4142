//! Structured logs via `tracing`: human text on a terminal, JSON lines for a
//! cluster's log pipeline (`--log-format`).
//!
//! Verbosity comes from `--log-level` when given, else `RUST_LOG`, else
//! `info`; both take `EnvFilter` directives (`debug`,
//! `info,portwise_controller::judge=trace`; `portwise=debug` covers
//! every portwise crate, since targets match by prefix). A bad directive is an error at start
//! that names where it came from, rather than silently logging nothing.
//!
//! Cranelift, the HTTP/TLS stacks and kube's client log every function
//! compiled, connection or request at debug level, which drowns the controller's own debug output
//! (the one operators turn on to ask "why isn't my pod in the slice?"). They
//! are capped at `warn` unless the directives name them explicitly.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Crates whose debug output is noise for an operator.
const NOISY: &[&str] = &[
    "cranelift_codegen",
    "cranelift_frontend",
    "regalloc2",
    "wasmtime_cranelift",
    "hyper",
    "hyper_util",
    "h2",
    "rustls",
    "tower",
    // One line per request (Lease renewals every 2 s, watches): at debug it
    // buries the controller's own output. Name it to see it.
    "kube_client",
];

/// Output format of the logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (colours only on a terminal).
    #[default]
    Text,
    /// One JSON object per line, event fields flattened to the top level.
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("invalid log filter {source_name} {directives:?}: {message}")]
    Filter {
        source_name: &'static str,
        directives: String,
        message: String,
    },
    #[error("a global tracing subscriber is already installed: {0}")]
    AlreadyInstalled(String),
}

/// Builds the filter from `--log-level` (when `Some`), else `RUST_LOG`, else
/// `info`.
pub fn filter(level: Option<&str>) -> Result<EnvFilter, LoggingError> {
    let env = std::env::var(EnvFilter::DEFAULT_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty());
    let (source_name, directives) = match (level, env) {
        (Some(level), _) => ("--log-level", level.to_owned()),
        (None, Some(env)) => ("RUST_LOG", env),
        (None, None) => ("default", "info".to_owned()),
    };
    filter_from(source_name, &directives)
}

fn filter_from(source_name: &'static str, directives: &str) -> Result<EnvFilter, LoggingError> {
    let error = |message: String| LoggingError::Filter {
        source_name,
        directives: directives.to_owned(),
        message,
    };
    if directives.trim().is_empty() {
        return Err(error("empty".to_owned()));
    }
    let mut full = directives.trim().to_owned();
    for noisy in NOISY {
        if !mentions(directives, noisy) {
            full.push_str(&format!(",{noisy}=warn"));
        }
    }
    EnvFilter::builder()
        .parse(&full)
        .map_err(|e| error(e.to_string()))
}

/// Whether a directive string names `target` (as a whole path segment).
fn mentions(directives: &str, target: &str) -> bool {
    directives.split(',').any(|d| {
        let t = d.trim().split(['=', '[']).next().unwrap_or_default();
        t == target || t.starts_with(&format!("{target}::"))
    })
}

/// Installs the global subscriber, writing to stderr.
pub fn init(format: LogFormat, level: Option<&str>) -> Result<(), LoggingError> {
    let filter = filter(level)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
    installed.map_err(|e| LoggingError::AlreadyInstalled(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noisy_crates_are_capped_unless_named() {
        let f = filter_from("--log-level", "debug").unwrap().to_string();
        assert!(f.contains("cranelift_codegen=warn"), "{f}");
        assert!(f.contains("debug"), "{f}");

        let f = filter_from("--log-level", "debug,cranelift_codegen=trace")
            .unwrap()
            .to_string();
        assert!(f.contains("cranelift_codegen=trace"), "{f}");
        assert!(!f.contains("cranelift_codegen=warn"), "{f}");
        // `hyper` capped although `hyper_util` is not named, and vice versa.
        let f = filter_from("--log-level", "info,hyper=debug")
            .unwrap()
            .to_string();
        assert!(
            f.contains("hyper_util=warn") && !f.contains("hyper=warn"),
            "{f}"
        );
    }

    #[test]
    fn bad_directives_name_their_source() {
        let err = filter_from("--log-level", "info,portwise=loud")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--log-level") && err.contains("portwise=loud"),
            "{err}"
        );
        let err = filter_from("RUST_LOG", "  ").unwrap_err().to_string();
        assert!(err.contains("RUST_LOG") && err.contains("empty"), "{err}");
    }

    #[test]
    fn flag_wins_over_environment() {
        // Only the explicit flag path; RUST_LOG is process-global and other
        // tests run in parallel, so it is not mutated here.
        let f = filter(Some("warn,portwise=trace")).unwrap().to_string();
        assert!(f.contains("portwise=trace"), "{f}");
    }
}
