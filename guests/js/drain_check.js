// portwise membership checker in JavaScript (QuickJS, built by componentize-qjs).
//
// Includes a pod for a port when a TCP connection to the port succeeds and
// the pod does not carry a drain annotation. The annotation lets an operator
// take one pod out of one Service's slices (`kubectl annotate pod x
// portwise.example.com/drain=true`) without touching readiness, which other
// Services and the kubelet share.
//
// Config (JSON):
//   {"annotation": "portwise.example.com/drain",  // optional, the default
//    "timeoutMs": 500}                            // optional, 1..60000
// The annotation drains when present with any value except "false".
//
// Answers: drained: exclude; dial ok: include; refused: exclude;
// timeout or denied by the host: abstain (keep what was last published).
//
// Built against portwise:membership@0.1.0 (wit/v0.1), which the host still
// serves, not 0.2: componentize-qjs 0.4.5 releases the borrowed pod and
// Service of a 0.2 call only after the call has returned, which wasmtime
// refuses ("borrow handles still remain at the end of the call"). See
// JS_WIT_VERSION in guests/build-polyglot. The 0.2 version of the one line
// that differs is `const drain = pod.annotation(cfg.annotation);` (a string
// or null) with the imports at @0.2.0.
import probes from "portwise:membership/probes@0.1.0";
import log from "portwise:membership/log@0.1.0";

const DEFAULTS = { annotation: "portwise.example.com/drain", timeoutMs: 500 };
const MAX_TIMEOUT_MS = 60000;

function parseConfig(raw) {
  let doc;
  try {
    doc = JSON.parse(raw);
  } catch (e) {
    throw `config is not JSON: ${e.message}`;
  }
  // `null` (no config in the portwise file) means all defaults.
  if (doc === null) doc = {};
  if (typeof doc !== "object" || Array.isArray(doc)) {
    throw "config must be an object";
  }
  const unknown = Object.keys(doc).filter((k) => !(k in DEFAULTS));
  if (unknown.length > 0) throw `unknown config keys: ${unknown.sort().join(", ")}`;
  const cfg = { ...DEFAULTS, ...doc };
  if (typeof cfg.annotation !== "string" || cfg.annotation === "") {
    throw "'annotation' must be a non-empty string";
  }
  if (!Number.isInteger(cfg.timeoutMs) || cfg.timeoutMs < 1 || cfg.timeoutMs > MAX_TIMEOUT_MS) {
    throw `'timeoutMs' must be an integer within 1..${MAX_TIMEOUT_MS}`;
  }
  return cfg;
}

// The host hands in the same config string on every call: parse it once.
let cached = { raw: null, cfg: null };
function configFor(raw) {
  if (cached.raw !== raw) cached = { raw, cfg: parseConfig(raw) };
  return cached.cfg;
}

const verdict = (decision, reason) => ({ decision, reason });

function validateConfig(config) {
  configFor(config); // throws the message string: the component's err
}

function check(config, service, pod, target) {
  let cfg;
  try {
    cfg = configFor(config);
  } catch (e) {
    return verdict("abstain", `bad config: ${e}`);
  }

  const drain = pod.annotations.find((kv) => kv.key === cfg.annotation);
  if (drain !== undefined && drain.value !== "false") {
    return verdict("exclude", `drained by annotation ${cfg.annotation}=${drain.value}`);
  }

  const where = `tcp ${target.address} port ${target.targetPort}`;
  try {
    probes.tcpDial("", target.targetPort, cfg.timeoutMs);
  } catch (e) {
    // A failed result<_, probe-error> arrives as the thrown variant value.
    const err = e && e.tag !== undefined ? e : e && e.payload;
    switch (err && err.tag) {
      case "refused":
        return verdict("exclude", `${where}: connection refused`);
      case "timeout":
        return verdict("abstain", `${where}: timed out`);
      case "denied":
        log.log("warn", `${where} denied by host: ${err.val}`);
        return verdict("abstain", `${where}: denied: ${err.val}`);
      case "io":
        return verdict("exclude", `${where}: ${err.val}`);
      default:
        return verdict("abstain", `${where}: unexpected failure ${String(e)}`);
    }
  }
  log.log("debug", `${where}: connected`);
  return verdict("include", `${where}: connected, not drained`);
}

export const checker = { validateConfig, check };
