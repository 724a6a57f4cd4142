/* portwise membership checker in C: a clone of the built-in portNames.
 *
 * Includes a pod for a port when a label or annotation of the pod lists the
 * Service port's name (comma-separated, whitespace trimmed), e.g.
 *   metadata.annotations["app.example.com/ports"] = "http, metrics"
 * With `dialTimeoutMs` set, a listed port must also accept a TCP connection
 * (through the host's `tcp-dial` probe): refused excludes, a timeout
 * abstains. It is deterministic and cheap, which is what C is good for here:
 * the component is a few tens of KB and a check takes microseconds.
 *
 * Config (JSON): {"annotation": "KEY"} or {"label": "KEY"}, plus optional
 * "dialTimeoutMs": 1..60000. Anything else is rejected by validate-config.
 *
 * Written against portwise:membership@0.2.1: the pod is a borrowed host
 * resource, and the checker asks it for the one label or annotation it needs
 * (`portwise_membership_types_method_pod_label` / `_annotation`: one host
 * call that copies only that value) instead of receiving every label and
 * annotation of the pod on every call.
 *
 * Memory: wit-bindgen's C bindings hand every argument to the export, which
 * owns (and here frees) it, including the pod and Service borrow handles,
 * which the export must drop before it returns; the answer of a query
 * (here the label's value) is malloc'd in the guest and ours to free;
 * returned strings are malloc'd and freed by the generated post-return
 * function after the host has copied them. An instance is reused for many
 * checks, so a leak here would grow until the host's memory limit traps
 * it. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "membership_checker.h"

typedef membership_checker_string_t str_t;
typedef portwise_membership_types_borrow_pod_t pod_t;

static void set_message(str_t *out, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    membership_checker_string_dup(out, buf);
}

static void verdict(exports_portwise_membership_checker_verdict_t *ret,
                    portwise_membership_types_decision_t decision, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ret->decision = decision;
    ret->reason.is_some = true;
    membership_checker_string_dup(&ret->reason.val, buf);
}

static void log_debug(const char *fmt, ...) {
    char buf[512];
    str_t msg;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    membership_checker_string_set(&msg, buf); /* borrowed: not freed */
    portwise_membership_log_log(PORTWISE_MEMBERSHIP_LOG_LEVEL_DEBUG, &msg);
}

/* The pod's label or annotation `key`: one host call that copies only that
 * value. True and fills `value` (heap-allocated: the caller frees it) when
 * present. */
static bool pod_value(pod_t pod, enum pn_source source, const char *key, str_t *value) {
    str_t k;
    membership_checker_string_set(&k, key); /* borrowed by the call: not freed */
    return source == PN_ANNOTATION ? portwise_membership_types_method_pod_annotation(pod, &k, value)
                                   : portwise_membership_types_method_pod_label(pod, &k, value);
}

/* The last config seen, parsed: the host passes the same string every call. */
static char *cached_raw;
static size_t cached_len;
static struct pn_config cached;

static int config_for(const str_t *raw, struct pn_config *out, char *err, size_t err_len) {
    if (cached_raw && cached_len == raw->len && memcmp(cached_raw, raw->ptr, raw->len) == 0) {
        *out = cached;
        return 0;
    }
    if (pn_parse_config((const char *)raw->ptr, raw->len, out, err, err_len) != 0) return -1;
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
    struct pn_config cfg;
    char msg[256];
    int rc = config_for(config, &cfg, msg, sizeof msg);
    membership_checker_string_free(config);
    if (rc != 0) {
        set_message(err, "%s", msg);
        return false;
    }
    return true;
}

/* Judges the port against `list`, the value of the configured label or
 * annotation. */
static void judge_listed(const struct pn_config *cfg, const str_t *list,
                         const portwise_membership_types_target_t *target,
                         exports_portwise_membership_checker_verdict_t *ret) {
    const char *kind = cfg->source == PN_ANNOTATION ? "annotation" : "label";
    const str_t *name = &target->port_name;
    portwise_membership_probes_probe_error_t perr;
    str_t any_host = { NULL, 0 }; /* empty host: the address under judgement */

    if (!pn_list_has((const char *)list->ptr, list->len, (const char *)name->ptr, name->len)) {
        verdict(ret, PORTWISE_MEMBERSHIP_TYPES_DECISION_EXCLUDE, "%s %s does not list %.*s", kind, cfg->key,
                (int)name->len, (const char *)name->ptr);
        return;
    }
    if (cfg->dial_timeout_ms == 0) {
        verdict(ret, PORTWISE_MEMBERSHIP_TYPES_DECISION_INCLUDE, "%s %s lists %.*s", kind, cfg->key,
                (int)name->len, (const char *)name->ptr);
        return;
    }

    log_debug("%.*s listed; dialing port %u", (int)name->len, (const char *)name->ptr, target->target_port);
    if (portwise_membership_probes_tcp_dial(&any_host, target->target_port, cfg->dial_timeout_ms, &perr)) {
        verdict(ret, PORTWISE_MEMBERSHIP_TYPES_DECISION_INCLUDE, "%.*s listed, port %u accepts connections",
                (int)name->len, (const char *)name->ptr, target->target_port);
        return;
    }
    switch (perr.tag) {
    case PORTWISE_MEMBERSHIP_PROBES_PROBE_ERROR_REFUSED:
        verdict(ret, PORTWISE_MEMBERSHIP_TYPES_DECISION_EXCLUDE, "%.*s listed, port %u refused the connection",
                (int)name->len, (const char *)name->ptr, target->target_port);
        break;
    case PORTWISE_MEMBERSHIP_PROBES_PROBE_ERROR_TIMEOUT:
        verdict(ret, PORTWISE_MEMBERSHIP_TYPES_DECISION_ABSTAIN, "dial port %u timed out", target->target_port);
        break;
    case PORTWISE_MEMBERSHIP_PROBES_PROBE_ERROR_DENIED:
        verdict(ret, PORTWISE_MEMBERSHIP_TYPES_DECISION_ABSTAIN, "dial port %u denied: %.*s", target->target_port,
                (int)perr.val.denied.len, (const char *)perr.val.denied.ptr);
        break;
    default:
        verdict(ret, PORTWISE_MEMBERSHIP_TYPES_DECISION_EXCLUDE, "dial port %u: %.*s", target->target_port,
                (int)perr.val.io.len, (const char *)perr.val.io.ptr);
        break;
    }
    portwise_membership_probes_probe_error_free(&perr);
}

static void judge(const str_t *config, pod_t pod, const portwise_membership_types_target_t *target,
                  exports_portwise_membership_checker_verdict_t *ret) {
    struct pn_config cfg;
    char msg[256];
    const char *kind;
    str_t list;

    if (config_for(config, &cfg, msg, sizeof msg) != 0) {
        verdict(ret, PORTWISE_MEMBERSHIP_TYPES_DECISION_ABSTAIN, "bad config: %s", msg);
        return;
    }
    kind = cfg.source == PN_ANNOTATION ? "annotation" : "label";
    if (target->port_name.len == 0) {
        verdict(ret, PORTWISE_MEMBERSHIP_TYPES_DECISION_EXCLUDE, "the Service port has no name to list");
        return;
    }
    if (!pod_value(pod, cfg.source, cfg.key, &list)) {
        verdict(ret, PORTWISE_MEMBERSHIP_TYPES_DECISION_EXCLUDE, "pod has no %s %s", kind, cfg.key);
        return;
    }
    judge_listed(&cfg, &list, target, ret);
    membership_checker_string_free(&list);
}

void exports_portwise_membership_checker_check(str_t *config, exports_portwise_membership_checker_borrow_service_t service,
                                              exports_portwise_membership_checker_borrow_pod_t pod,
                                              exports_portwise_membership_checker_target_t *target,
                                              exports_portwise_membership_checker_verdict_t *ret) {
    judge(config, pod, target, ret);
    membership_checker_string_free(config);
    /* The component model requires a borrow lent to an export to be dropped
     * before the export returns: the host traps the call otherwise. */
    portwise_membership_types_service_drop_borrow(service);
    portwise_membership_types_pod_drop_borrow(pod);
    exports_portwise_membership_checker_target_free(target);
}
