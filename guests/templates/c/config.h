/* The template's config, parsed from the JSON the host hands in.
 *
 * Kept apart from the bindings so it compiles natively too (see
 * config_test.c): the config parser is the part of a guest most worth
 * testing without a WebAssembly host. */
#ifndef PORTWISE_TEMPLATE_CONFIG_H
#define PORTWISE_TEMPLATE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

struct tpl_config {
    /* The pod label to read (required). */
    char label[256];
    /* HTTP GET this path on the target port; empty: dial the port. */
    char path[256];
    /* Probe timeout, 1..60000 ms (default 1000). */
    uint32_t timeout_ms;
    /* Add your own keys here (and to tpl_parse_config). */
};

/* Parses `json` (length `len`, not NUL-terminated). Returns 0 and fills
 * `out`, or returns -1 and writes a message (NUL-terminated) into `err`. */
int tpl_parse_config(const char *json, size_t len, struct tpl_config *out, char *err, size_t err_len);

#endif
