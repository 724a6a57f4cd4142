//! The WebAssembly runtime's integration tests, one binary: the real guests
//! of every language, replayed probes and fuzzed guest answers.

mod common;

mod fuzz_guest_answers;
mod polyglot_guests;
mod replay;
mod wasm;
