//! The `portwise` binary's integration tests, one binary: `check` and its
//! record/replay/bench modes, and the starter templates' recordings.

#[path = "../../../wasm/tests/it/common/mod.rs"]
mod common;

mod check_cli;
mod check_replay;
mod templates;
