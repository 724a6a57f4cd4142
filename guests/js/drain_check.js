// portwise membership checker in JavaScript (StarlingMonkey, built by
// @bytecodealliance/componentize-js against portwise:membership@0.2.1).
//
// Includes a pod for a port when a TCP connection to the port succeeds and
// the pod does not carry a drain annotation. The annotation lets an operator
// take one pod out of one Service's slices (`kubectl annotate pod x
// app.example.com/drain=true`) without touching readiness, which other
// Services and the kubelet share.
//
// Config (JSON):
//   {"annotation": "app.example.com/drain",  // optional, the default
//    "timeoutMs": 500}                            // optional, 1..60000
// The annotation drains when present with any value except "false".
//
// Answers: drained: exclude; dial ok: include; refused: exclude;
// timeout or denied by the host: abstain (keep what was last published).
//
// Each imported interface is an ES module whose named exports are its
// functions (camelCase): `import * as probes` gives `probes.tcpDial`.
import * as probes from "portwise:membership/probes@0.2.1";
import * as log from "portwise:membership/log@0.2.1";

const DEFAULTS = { annotation: "app.example.com/drain", timeoutMs: 500 };
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

  // `pod` is a borrowed host resource (portwise:membership@0.2.1): one
  // host call reads the one annotation, `undefined` when absent (an
  // option<T> is the value or undefined). The wrapper expires when this call
  // returns, so it is not kept.
  const drain = pod.annotation(cfg.annotation);
  if (drain != null && drain !== "false") {
    return verdict("exclude", `drained by annotation ${cfg.annotation}=${drain}`);
  }

  const where = `tcp ${target.address} port ${target.targetPort}`;
  try {
    probes.tcpDial("", target.targetPort, cfg.timeoutMs);
  } catch (e) {
    // A failed result<_, probe-error> is thrown as an Error whose `payload`
    // is the variant value ({tag: "refused"}, {tag: "denied", val: "..."}).
    const err = e && e.payload;
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
