// A starter membership checker in JavaScript (StarlingMonkey, built by
// @bytecodealliance/componentize-js against portwise:membership@0.2.1): copy
// this directory and put your own logic where the comments say so.
//
// What it does as it stands: a pod backs the port when it carries the
// configured label (any value but "false") and the target port answers a
// probe: an HTTP GET of `path` answering 2xx when `path` is set, a TCP dial
// otherwise. A refused connection or another status excludes; a timeout
// abstains (not the pod's fault: portwise keeps what it published last).
//
// Config (JSON):
//   {"label": "app.example.com/serve",  // required: the pod label to read
//    "path": "/healthz",                // optional: HTTP GET this path
//    "timeoutMs": 1000}                 // optional, 1..60000 (default 1000)
//
// Each imported interface is an ES module whose named exports are its
// functions (camelCase): `import * as probes` gives `probes.httpGet`.
import * as probes from "portwise:membership/probes@0.2.1";

// Add your own keys here, with their defaults, and check them below.
const DEFAULTS = { path: null, timeoutMs: 1000 };
const KNOWN_KEYS = ["label", "path", "timeoutMs"];

// Parses and checks the config; throws the message. Put every rule here, so
// that validateConfig rejects what check could not use.
function parseConfig(raw) {
  let doc;
  try {
    doc = JSON.parse(raw);
  } catch (e) {
    throw `config is not JSON: ${e.message}`;
  }
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) {
    throw 'config must be an object with at least "label"';
  }
  // A typo must fail at load time, not silently mean "defaults".
  const unknown = Object.keys(doc).filter((k) => !KNOWN_KEYS.includes(k)).sort();
  if (unknown.length > 0) throw `unknown config key "${unknown[0]}" (known: label, path, timeoutMs)`;
  const cfg = { ...DEFAULTS, ...doc };
  if (typeof cfg.label !== "string" || cfg.label === "") {
    throw 'config needs "label" (the pod label to read), a non-empty string';
  }
  if (cfg.path !== null && (typeof cfg.path !== "string" || !cfg.path.startsWith("/"))) {
    throw `path: must start with /, got ${JSON.stringify(cfg.path)}`;
  }
  if (!Number.isInteger(cfg.timeoutMs) || cfg.timeoutMs < 1 || cfg.timeoutMs > 60000) {
    throw `timeoutMs: must be an integer within 1..60000, got ${JSON.stringify(cfg.timeoutMs)}`;
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

// A failed probe is thrown as an Error whose `payload` is the probe-error
// variant ({tag: "refused"}, {tag: "denied", val: "..."}). Abstain when it is
// not the pod's fault (a timeout, a probe the host denied, the prober's own
// "unreachable:" failures); exclude otherwise.
function probeFailed(what, e) {
  const err = e && e.payload;
  switch (err && err.tag) {
    case "timeout":
      return verdict("abstain", `${what}: timeout`);
    case "refused":
      return verdict("exclude", `${what}: connection refused`);
    case "denied":
      return verdict("abstain", `${what}: denied: ${err.val}`);
    case "io":
      return verdict(err.val.startsWith("unreachable:") ? "abstain" : "exclude", `${what}: ${err.val}`);
    default:
      return verdict("abstain", `${what}: unexpected failure ${String(e)}`);
  }
}

function validateConfig(config) {
  configFor(config); // throws the message string: the component's err
}

function check(config, service, pod, target) {
  let cfg;
  try {
    cfg = configFor(config);
  } catch (e) {
    // Never guess with a config validateConfig would reject.
    return verdict("abstain", `bad config: ${e}`);
  }

  // 1. Facts about the pod: `pod` is a borrowed host resource, and each
  //    by-key query is one host call (an option is the value or
  //    `undefined`: compare with `== null`). Do not keep `pod` or `service`
  //    past this call. Replace or extend this with your own rules
  //    (pod.annotation, pod.condition, service.annotation, ...).
  const value = pod.label(cfg.label);
  if (value == null) return verdict("exclude", `pod has no label ${cfg.label}`);
  if (value === "false") return verdict("exclude", `label ${cfg.label}=false`);

  // 2. One probe of the address under judgement (the host reaches no other;
  //    host "" means that address), and 3. the verdict, with a reason
  //    (`portwise check` and the debug log show it). Change the path, the
  //    port or what counts as healthy here. The kubelet's other probes
  //    (WIT 0.2.1): HTTPS with headers,
  //      probes.httpGetWith({ host: "", port, path: "/ready", timeoutMs: 1000 },
  //                         { tls: true, headers: [{ name: "Authorization", value: "Bearer t" }] })
  //    and grpc.health.v1, whose answer is { tag: "status", val: "serving" } when healthy:
  //      probes.grpcHealth("", port, "my.Service", 1000)
  const port = target.targetPort;
  if (cfg.path !== null) {
    const what = `GET ${cfg.path} on port ${port}`;
    let response;
    try {
      response = probes.httpGet({ host: "", port, path: cfg.path, timeoutMs: cfg.timeoutMs });
    } catch (e) {
      return probeFailed(what, e);
    }
    if (response.status >= 200 && response.status < 300) {
      return verdict("include", `label ${cfg.label}=${value}, ${what}: ${response.status}`);
    }
    return verdict("exclude", `${what}: ${response.status}`);
  }

  const what = `TCP dial of port ${port}`;
  try {
    probes.tcpDial("", port, cfg.timeoutMs);
  } catch (e) {
    return probeFailed(what, e);
  }
  return verdict("include", `label ${cfg.label}=${value}, ${what}: connected`);
}

export const checker = { validateConfig, check };
