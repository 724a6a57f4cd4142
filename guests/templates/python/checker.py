"""A starter membership checker in Python: copy this directory and put your
own logic where the comments say so.

What it does as it stands: a pod backs the port when it carries the
configured label (any value but "false") and the target port answers a
probe: an HTTP GET of `path` answering 2xx when `path` is set, a TCP dial
otherwise. A refused connection or another status excludes; a timeout
abstains (not the pod's fault: portwise keeps what it published last).

Config (JSON, from the portwise config file):

    {"label": "app.example.com/serve",   # required: the pod label to read
     "path": "/healthz",                 # optional: HTTP GET this path
     "timeoutMs": 1000}                  # optional, 1..60000 (default 1000)

Built with componentize-py against portwise:membership@0.2.1: `pod` and
`service` are borrowed host resources, queried by key, valid only during
`check`.
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import probes
from wit_world.imports.types import Decision, Pod, Service, Target, Verdict

# Add your own keys here, with their defaults, and check them below.
DEFAULTS = {"path": None, "timeoutMs": 1000}
KNOWN_KEYS = {"label", "path", "timeoutMs"}


class ConfigError(ValueError):
    pass


def parse_config(raw: str) -> dict:
    """Parse and check the config. Put every rule here, so that
    validate_config rejects what check could not use."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"config is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError('config must be an object with at least "label"')
    unknown = sorted(set(doc) - KNOWN_KEYS)
    if unknown:
        # A typo must fail at load time, not silently mean "defaults".
        raise ConfigError(f'unknown config key "{unknown[0]}" (known: label, path, timeoutMs)')
    cfg = {**DEFAULTS, **doc}
    if not isinstance(cfg.get("label"), str) or not cfg["label"]:
        raise ConfigError('config needs "label" (the pod label to read), a non-empty string')
    path = cfg["path"]
    if path is not None and (not isinstance(path, str) or not path.startswith("/")):
        raise ConfigError(f"path: must start with /, got {path!r}")
    timeout = cfg["timeoutMs"]
    # bool is an int subclass in Python; `true` is not a timeout.
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout <= 60_000:
        raise ConfigError(f"timeoutMs: must be an integer within 1..60000, got {timeout!r}")
    return cfg


# The host passes the same config string on every call: parse it once.
_parsed: tuple = (None, None)


def config_for(raw: str) -> dict:
    global _parsed
    if _parsed[0] != raw:
        _parsed = (raw, parse_config(raw))
    return _parsed[1]


def probe_failed(what: str, err) -> Verdict:
    """Abstain when the failure is not the pod's fault (a timeout, a probe the
    host denied, the prober's own "unreachable:" failures); exclude otherwise."""
    if isinstance(err, probes.ProbeError_Timeout):
        return Verdict(Decision.ABSTAIN, f"{what}: timeout")
    if isinstance(err, probes.ProbeError_Refused):
        return Verdict(Decision.EXCLUDE, f"{what}: connection refused")
    if isinstance(err, probes.ProbeError_Denied):
        return Verdict(Decision.ABSTAIN, f"{what}: denied: {err.value}")
    unreachable = err.value.startswith("unreachable:")
    return Verdict(Decision.ABSTAIN if unreachable else Decision.EXCLUDE, f"{what}: {err.value}")


class Checker(exports.Checker):
    def validate_config(self, config: str) -> None:
        try:
            config_for(config)
        except ConfigError as e:
            raise Err(str(e))

    def check(self, config: str, service: Service, pod: Pod, target: Target) -> Verdict:
        try:
            cfg = config_for(config)
        except ConfigError as e:
            # Never guess with a config validate_config would reject.
            return Verdict(Decision.ABSTAIN, f"bad config: {e}")

        # 1. Facts about the pod: one host call per by-key query. Replace or
        #    extend this with your own rules (pod.annotation, pod.condition,
        #    service.annotation, ...).
        label = cfg["label"]
        value = pod.label(label)
        if value is None:
            return Verdict(Decision.EXCLUDE, f"pod has no label {label}")
        if value == "false":
            return Verdict(Decision.EXCLUDE, f"label {label}=false")

        # 2. One probe of the address under judgement (the host reaches no
        #    other; host="" means that address), and 3. the verdict, with a
        #    reason (`portwise check` and the debug log show it). Change the
        #    path, the port or what counts as healthy here. The kubelet's
        #    other probes (WIT 0.2.1): HTTPS with headers,
        #      probes.http_get_with(request, probes.HttpOptions(tls=True,
        #          headers=[probes.HttpHeader(name="Authorization", value="Bearer t")]))
        #    and grpc.health.v1 (SERVING is the one healthy answer):
        #      probes.grpc_health("", port, "my.Service", 1000)
        port = target.target_port
        if cfg["path"] is not None:
            what = f"GET {cfg['path']} on port {port}"
            request = probes.HttpRequest(host="", port=port, path=cfg["path"], timeout_ms=cfg["timeoutMs"])
            try:
                response = probes.http_get(request)
            except Err as e:
                return probe_failed(what, e.value)
            if 200 <= response.status < 300:
                return Verdict(Decision.INCLUDE, f"label {label}={value}, {what}: {response.status}")
            return Verdict(Decision.EXCLUDE, f"{what}: {response.status}")

        what = f"TCP dial of port {port}"
        try:
            probes.tcp_dial("", port, cfg["timeoutMs"])
        except Err as e:
            return probe_failed(what, e.value)
        return Verdict(Decision.INCLUDE, f"label {label}={value}, {what}: connected")
