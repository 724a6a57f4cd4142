"""portwise membership checker in Python: HTTP health plus a tier label.

Includes a pod for a port when the pod's tier label is one of the configured
tiers and `GET <path>` on the port answers 2xx. It shows the two things most
real checkers combine: a fact about the pod (a label) and a probe of the
address under judgement through the host's `http-get` import. The guest never
opens a socket itself: it has none, only the host's probes. Written against
`portwise:membership@0.2.1`, where the pod is a borrowed host resource
queried by key (`pod.label(key)`) rather than a copied record.

Config (JSON, from the portwise config file):

    {"tiers": ["frontend", "api"],   # required, non-empty list of strings
     "label": "tier",                # label holding the tier (default "tier")
     "path": "/healthz",             # probe path (default "/healthz")
     "timeoutMs": 1000}              # probe timeout (default 1000, 1..60000)

Answers:
- the label is missing or its value is not listed: exclude;
- the probe answers 2xx: include; any other status: exclude;
- connection refused or broken: exclude (like a failing kubelet probe);
- timeout, or the host denied the probe: abstain, so portwise keeps what it
  last published instead of flapping on a slow pod.
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import log, probes
from wit_world.imports.types import Decision, Pod, Service, Target, Verdict

DEFAULTS = {"label": "tier", "path": "/healthz", "timeoutMs": 1000}
KNOWN_KEYS = {"tiers", "label", "path", "timeoutMs"}
MAX_TIMEOUT_MS = 60_000


class ConfigError(ValueError):
    pass


def parse_config(raw: str) -> dict:
    """Parse and validate the guest config; raise ConfigError on any fault."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"config is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError("config must be an object with at least 'tiers'")
    unknown = sorted(set(doc) - KNOWN_KEYS)
    if unknown:
        # A typo such as "tier" for "tiers" must not silently mean "defaults".
        raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
    cfg = dict(DEFAULTS)
    cfg.update(doc)

    tiers = cfg.get("tiers")
    if not isinstance(tiers, list) or not tiers:
        raise ConfigError("'tiers' must be a non-empty list of strings")
    if not all(isinstance(t, str) and t for t in tiers):
        raise ConfigError("'tiers' must contain only non-empty strings")
    if not isinstance(cfg["label"], str) or not cfg["label"]:
        raise ConfigError("'label' must be a non-empty string")
    path = cfg["path"]
    if not isinstance(path, str) or not path.startswith("/"):
        raise ConfigError("'path' must be an absolute path such as /healthz")
    timeout = cfg["timeoutMs"]
    # bool is an int subclass in Python; `true` is not a timeout.
    if isinstance(timeout, bool) or not isinstance(timeout, int):
        raise ConfigError("'timeoutMs' must be an integer")
    if not 1 <= timeout <= MAX_TIMEOUT_MS:
        raise ConfigError(f"'timeoutMs' must be within 1..{MAX_TIMEOUT_MS}")
    cfg["tiers"] = frozenset(tiers)
    return cfg


# The host passes the same config string on every call; parse it once.
_parsed: tuple = ("", None)


def config_for(raw: str) -> dict:
    global _parsed
    if _parsed[0] != raw or _parsed[1] is None:
        _parsed = (raw, parse_config(raw))
    return _parsed[1]


def verdict(decision: Decision, reason: str) -> Verdict:
    return Verdict(decision=decision, reason=reason)


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
            # validate-config should have caught this; never guess.
            return verdict(Decision.ABSTAIN, f"bad config: {e}")

        # `pod` is a borrowed host resource: `pod.label(key)` is one host call
        # that copies just that value (valid only during this call).
        tier = pod.label(cfg["label"])
        if tier is None:
            return verdict(Decision.EXCLUDE, f"pod has no label {cfg['label']}")
        if tier not in cfg["tiers"]:
            return verdict(Decision.EXCLUDE, f"tier {tier!r} is not served")

        request = probes.HttpRequest(
            host="", port=target.target_port, path=cfg["path"], timeout_ms=cfg["timeoutMs"]
        )
        where = f"GET {cfg['path']} on port {target.target_port}"
        try:
            response = probes.http_get(request)
        except Err as e:
            err = e.value
            if isinstance(err, probes.ProbeError_Timeout):
                return verdict(Decision.ABSTAIN, f"{where}: timed out")
            if isinstance(err, probes.ProbeError_Refused):
                return verdict(Decision.EXCLUDE, f"{where}: connection refused")
            if isinstance(err, probes.ProbeError_Denied):
                log.log(log.Level.WARN, f"{where} denied by host: {err.value}")
                return verdict(Decision.ABSTAIN, f"{where}: denied: {err.value}")
            return verdict(Decision.EXCLUDE, f"{where}: {err.value}")

        if 200 <= response.status < 300:
            return verdict(Decision.INCLUDE, f"tier {tier}, {where}: {response.status}")
        log.log(log.Level.DEBUG, f"{where} answered {response.status}")
        return verdict(Decision.EXCLUDE, f"{where}: {response.status}")
