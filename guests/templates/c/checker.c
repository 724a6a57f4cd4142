/* A starter membership checker in C: copy this directory and put your own
 * logic where the comments say so.
 *
 * What it does as it stands: a pod backs the port when it carries the
 * configured label (any value but "false") and the target port answers a
 * probe: an HTTP GET of `path` answering 2xx when `path` is set, a TCP dial
 * otherwise. A refused connection or another status excludes; a timeout
 * abstains (not the pod's fault: portwise keeps what it published last).
 *
 * Config (JSON): {"label": KEY, "path": "/healthz", "timeoutMs": 1000}; only
 * "label" is required, any other key is rejected (config.c).
 *
 * Memory rules of wit-bindgen's C bindings, which every function below
 * follows:
 * - the export owns its arguments and frees them (`*_free`);
 * - the pod and Service borrow handles must be dropped before `check`
 *   returns, or the host traps the call;
 * - answers of imports (a label's value, a response body, a probe error's
 *   string) are malloc'd in the guest and ours to free;
 * - returned strings are malloc'd (membership_checker_string_dup) and freed
 *   by the generated post-return function.
 * An instance serves thousands of checks, so a leak grows until the host's
 * memory limit traps it. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "membership_checker.h"

typedef membership_checker_string_t str_t;
typedef exports_portwise_membership_checker_verdict_t verdict_t;

#define INCLUDE PORTWISE_MEMBERSHIP_TYPES_DECISION_INCLUDE
#define EXCLUDE PORTWISE_MEMBERSHIP_TYPES_DECISION_EXCLUDE
#define ABSTAIN PORTWISE_MEMBERSHIP_TYPES_DECISION_ABSTAIN

/* Sets the verdict and its reason (printf-style). */
static void verdict(verdict_t *ret, portwise_membership_types_decision_t decision, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ret->decision = decision;
    ret->reason.is_some = true;
    membership_checker_string_dup(&ret->reason.val, buf);
}

/* The last config seen, parsed: the host passes the same string every call. */
static char *cached_raw;
static size_t cached_len;
static struct tpl_config cached;

static int config_for(const str_t *raw, struct tpl_config *out, char *err, size_t err_len) {
    if (cached_raw && cached_len == raw->len && memcmp(cached_raw, raw->ptr, raw->len) == 0) {
        *out = cached;
        return 0;
    }
    if (tpl_parse_config((const char *)raw->ptr, raw->len, out, err, err_len) != 0) return -1;
    free(cached_raw);
    cached_raw = malloc(raw->len ? raw->len : 1);
    if (cached_raw) {
        memcpy(cached_raw, raw->ptr, raw->len);
        cached_len = raw->len;
        cached = *out;
    }
    return 0;
}

bool exports_portwise_membership_checker_validate_config(str_t *config, str_t *err) {
    struct tpl_config cfg;
    char msg[256];
    int rc = config_for(config, &cfg, msg, sizeof msg);
    membership_checker_string_free(config);
    if (rc != 0) {
        membership_checker_string_dup(err, msg);
        return false;
    }
    return true;
}

/* A failed probe: abstain when it is not the pod's fault (a timeout, a probe
 * the host denied, the prober's own "unreachable:" failures), exclude
 * otherwise. Frees the error. */
static void probe_failed(verdict_t *ret, const char *what, portwise_membership_probes_probe_error_t *e) {
    switch (e->tag) {
    case PORTWISE_MEMBERSHIP_PROBES_PROBE_ERROR_TIMEOUT:
        verdict(ret, ABSTAIN, "%s: timeout", what);
        break;
    case PORTWISE_MEMBERSHIP_PROBES_PROBE_ERROR_REFUSED:
        verdict(ret, EXCLUDE, "%s: connection refused", what);
        break;
    case PORTWISE_MEMBERSHIP_PROBES_PROBE_ERROR_DENIED:
        verdict(ret, ABSTAIN, "%s: denied: %.*s", what, (int)e->val.denied.len, (const char *)e->val.denied.ptr);
        break;
    default: {
        const str_t *m = &e->val.io;
        int unreachable = m->len >= 12 && memcmp(m->ptr, "unreachable:", 12) == 0;
        verdict(ret, unreachable ? ABSTAIN : EXCLUDE, "%s: %.*s", what, (int)m->len, (const char *)m->ptr);
        break;
    }
    }
    portwise_membership_probes_probe_error_free(e);
}

static void judge(const str_t *config, portwise_membership_types_borrow_pod_t pod,
                  const portwise_membership_types_target_t *target, verdict_t *ret) {
    struct tpl_config cfg;
    char msg[256], what[320];
    str_t key, value;
    uint16_t port = target->target_port;
    portwise_membership_probes_probe_error_t perr;

    /* Never guess with a config validate-config would reject. */
    if (config_for(config, &cfg, msg, sizeof msg) != 0) {
        verdict(ret, ABSTAIN, "bad config: %s", msg);
        return;
    }

    /* 1. Facts about the pod: one host call per by-key query, whose answer
     *    is ours to free. Replace or extend this with your own rules
     *    (_method_pod_annotation, _condition, _method_service_annotation, ...). */
    membership_checker_string_set(&key, cfg.label); /* borrowed by the call: not freed */
    if (!portwise_membership_types_method_pod_label(pod, &key, &value)) {
        verdict(ret, EXCLUDE, "pod has no label %s", cfg.label);
        return;
    }
    if (value.len == 5 && memcmp(value.ptr, "false", 5) == 0) {
        verdict(ret, EXCLUDE, "label %s=false", cfg.label);
        membership_checker_string_free(&value);
        return;
    }

    /* 2. One probe of the address under judgement (the host reaches no
     *    other; an empty host means that address), and 3. the verdict, with
     *    a reason (`portwise check` and the debug log show it). Change the
     *    path, the port or what counts as healthy here. */
    /* The kubelet's other probes (WIT 0.2.1): HTTPS with headers,
     *   portwise_membership_probes_http_get_with(&req, &opts, &resp, &perr)
     * with opts.tls = true and opts.headers a list of {name, value}; and
     * grpc.health.v1, SERVING being the one healthy answer:
     *   portwise_membership_probes_grpc_health(&any_host, port, &service,
     *                                          cfg.timeout_ms, &answer, &perr) */
    if (cfg.path[0] != '\0') {
        portwise_membership_probes_http_request_t req;
        portwise_membership_probes_http_response_t resp;
        snprintf(what, sizeof what, "GET %s on port %u", cfg.path, port);
        req.host = (str_t){ NULL, 0 };
        req.port = port;
        membership_checker_string_set(&req.path, cfg.path); /* borrowed: not freed */
        req.timeout_ms = cfg.timeout_ms;
        if (!portwise_membership_probes_http_get(&req, &resp, &perr)) {
            probe_failed(ret, what, &perr);
        } else {
            if (resp.status >= 200 && resp.status < 300)
                verdict(ret, INCLUDE, "label %s=%.*s, %s: %u", cfg.label, (int)value.len, (const char *)value.ptr,
                        what, resp.status);
            else
                verdict(ret, EXCLUDE, "%s: %u", what, resp.status);
            portwise_membership_probes_http_response_free(&resp);
        }
    } else {
        str_t any_host = { NULL, 0 };
        snprintf(what, sizeof what, "TCP dial of port %u", port);
        if (!portwise_membership_probes_tcp_dial(&any_host, port, cfg.timeout_ms, &perr))
            probe_failed(ret, what, &perr);
        else
            verdict(ret, INCLUDE, "label %s=%.*s, %s: connected", cfg.label, (int)value.len,
                    (const char *)value.ptr, what);
    }
    membership_checker_string_free(&value);
}

void exports_portwise_membership_checker_check(str_t *config, exports_portwise_membership_checker_borrow_service_t service,
                                              exports_portwise_membership_checker_borrow_pod_t pod,
                                              exports_portwise_membership_checker_target_t *target, verdict_t *ret) {
    judge(config, pod, target, ret);
    membership_checker_string_free(config);
    /* The component model requires a borrow lent to an export to be dropped
     * before the export returns: the host traps the call otherwise. Keep
     * these two lines whatever you change above. */
    portwise_membership_types_service_drop_borrow(service);
    portwise_membership_types_pod_drop_borrow(pod);
    exports_portwise_membership_checker_target_free(target);
}
