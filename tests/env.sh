# Shared environment for the test command, the demo and CI. Sourced, not run.
# Everything expensive is cached outside the checkout, so a second run (and
# CI's second run on the same machine) only rebuilds what changed.
export PORTWISE_CACHE="${PORTWISE_CACHE:-$HOME/.cache/portwise}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PORTWISE_CACHE/target}"
export PORTWISE_GUESTS_DIR="${PORTWISE_GUESTS_DIR:-$PORTWISE_CACHE/guests}"
export PORTWISE_GUESTS_OUT="${PORTWISE_GUESTS_OUT:-$PORTWISE_GUESTS_DIR}"
export PATH="$HOME/.cargo/bin:$PATH"
# cargo-deny, pinned: tests/setup builds it once into the cache, tests/deny
# runs it (the dependency rules, licenses and sources).
export PORTWISE_CARGO_DENY_VERSION=0.20.2
export PORTWISE_CARGO_DENY="${PORTWISE_CARGO_DENY:-$PORTWISE_CACHE/tools/cargo-deny-$PORTWISE_CARGO_DENY_VERSION/bin/cargo-deny}"
# wkg (bytecodealliance/wasm-pkg-tools), pinned: publishes and fetches the
# WIT package portwise:membership (guests/sdk/pack, ship::sdk, the
# templates). tests/wkg/build builds it once into the cache (deferred by a cold ./test).
export PORTWISE_WKG_VERSION=0.16.1
export PORTWISE_WKG="${PORTWISE_WKG:-$PORTWISE_CACHE/tools/wkg-$PORTWISE_WKG_VERSION/bin/wkg}"
