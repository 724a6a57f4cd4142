/* Config of the C port-names checker, parsed from the JSON the host hands in.
 *
 * Kept apart from the bindings so it compiles natively too (see
 * config_test.c): a config parser is the part of a guest most worth testing
 * without a WebAssembly host. */
#ifndef PORTWISE_PORT_NAMES_CONFIG_H
#define PORTWISE_PORT_NAMES_CONFIG_H

#include <stddef.h>
#include <stdint.h>

enum pn_source { PN_ANNOTATION, PN_LABEL };

struct pn_config {
    enum pn_source source;
    /* The label or annotation key that lists port names. */
    char key[256];
    /* 0: names only; otherwise also require a TCP dial within this many ms. */
    uint32_t dial_timeout_ms;
};

/* Parses `json` (length `len`, not NUL-terminated). Returns 0 and fills
 * `out`, or returns -1 and writes a message (NUL-terminated) into `err`. */
int pn_parse_config(const char *json, size_t len, struct pn_config *out, char *err, size_t err_len);

/* True when the comma-separated `list` (length `list_len`) names `name`,
 * ignoring whitespace around each entry, as the built-in portNames does. */
int pn_list_has(const char *list, size_t list_len, const char *name, size_t name_len);

#endif
