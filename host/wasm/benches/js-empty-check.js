// The smallest JavaScript checker: reads nothing, probes nothing, answers
// abstain. What a call to it costs is the engine's own cost per call (the
// component boundary, StarlingMonkey's entry and exit, the verdict record
// lowered back), the floor under any JavaScript checker.
//
// Not shipped, not built by guests/build. Measured by hand (docs/benchmarks.md,
// row 6), with the toolchain guests/build installs:
//
//   d=$(mktemp -d); t=~/.cache/portwise/tools/componentize-js/node_modules/.bin
//   $t/componentize-js host/wasm/benches/js-empty-check.js --wit wit \
//     --world-name membership-checker -d http -d fetch-event -o $d/js-empty-check.wasm
//   cp ~/.cache/portwise/guests/{js-drain-check,admin-check}.wasm $d
//   PORTWISE_GUESTS_DIR=$d cargo bench -p portwise-wasm --bench wasm_overhead
function validateConfig(config) {}
function check(config, service, pod, target) {
  return { decision: "abstain", reason: "" };
}
export const checker = { validateConfig, check };
