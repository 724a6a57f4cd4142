/* The template's config parser: a strict, allocation-free JSON reader (the
 * one guests/c uses), then the template's own keys.
 *
 * wasi-libc has no JSON library and the config is tiny, so the guest carries
 * its own. It accepts exactly RFC 8259 JSON (anything else is a config error,
 * so a broken file is rejected at load time by validate-config rather than
 * misread) and bounds nesting depth. To add a key of your own: a field in
 * struct tpl_config (config.h), a branch in tpl_parse_config below, a case in
 * config_test.c. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAX_DEPTH 32
#define MAX_TIMEOUT_MS 60000u
#define DEFAULT_TIMEOUT_MS 1000u

struct reader {
    const char *p, *end;
    char *err;
    size_t err_len;
};

static int fail(struct reader *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, r->err_len, fmt, ap);
    va_end(ap);
    return -1;
}

static void skip_ws(struct reader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Reads a string at r->p (which is at the opening quote). When `out` is not
 * NULL the unescaped UTF-8 is stored there, NUL-terminated; a string that does
 * not fit is an error. */
static int read_string(struct reader *r, char *out, size_t out_len, size_t *n_out) {
    size_t n = 0;
    r->p++; /* opening quote */
    while (r->p < r->end) {
        unsigned char c = (unsigned char)*r->p++;
        uint32_t cp;
        if (c == '"') {
            if (out) out[n] = '\0';
            if (n_out) *n_out = n;
            return 0;
        }
        if (c < 0x20) return fail(r, "config is not JSON: control character in string");
        if (c != '\\') {
            if (out) {
                if (n + 1 >= out_len) return fail(r, "config string longer than %zu bytes", out_len - 1);
                out[n] = (char)c;
            }
            n++;
            continue;
        }
        if (r->p >= r->end) break;
        c = (unsigned char)*r->p++;
        switch (c) {
        case '"': case '\\': case '/': cp = c; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u': {
            int i;
            cp = 0;
            if (r->end - r->p < 4) return fail(r, "config is not JSON: short \\u escape");
            for (i = 0; i < 4; i++) {
                int h = hexval(r->p[i]);
                if (h < 0) return fail(r, "config is not JSON: bad \\u escape");
                cp = cp * 16 + (uint32_t)h;
            }
            r->p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* surrogate pair */
                uint32_t lo = 0;
                if (r->end - r->p < 6 || r->p[0] != '\\' || r->p[1] != 'u')
                    return fail(r, "config is not JSON: lone surrogate");
                for (i = 2; i < 6; i++) {
                    int h = hexval(r->p[i]);
                    if (h < 0) return fail(r, "config is not JSON: bad \\u escape");
                    lo = lo * 16 + (uint32_t)h;
                }
                if (lo < 0xDC00 || lo > 0xDFFF) return fail(r, "config is not JSON: lone surrogate");
                r->p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return fail(r, "config is not JSON: lone surrogate");
            }
            break;
        }
        default:
            return fail(r, "config is not JSON: bad escape \\%c", c);
        }
        {
            char buf[4];
            size_t k, len;
            if (cp < 0x80) { buf[0] = (char)cp; len = 1; }
            else if (cp < 0x800) { buf[0] = (char)(0xC0 | cp >> 6); buf[1] = (char)(0x80 | (cp & 0x3F)); len = 2; }
            else if (cp < 0x10000) { buf[0] = (char)(0xE0 | cp >> 12); buf[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); buf[2] = (char)(0x80 | (cp & 0x3F)); len = 3; }
            else { buf[0] = (char)(0xF0 | cp >> 18); buf[1] = (char)(0x80 | ((cp >> 12) & 0x3F)); buf[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); buf[3] = (char)(0x80 | (cp & 0x3F)); len = 4; }
            for (k = 0; k < len; k++) {
                if (out) {
                    if (n + 1 >= out_len) return fail(r, "config string longer than %zu bytes", out_len - 1);
                    out[n] = buf[k];
                }
                n++;
            }
        }
    }
    return fail(r, "config is not JSON: unterminated string");
}

/* Reads a number; when it is a non-negative integer that fits, stores it in
 * *as_uint and sets *is_uint. */
static int read_number(struct reader *r, uint64_t *as_uint, int *is_uint) {
    const char *start = r->p;
    int integral = 1, negative = 0;
    uint64_t v = 0;
    if (r->p < r->end && *r->p == '-') { negative = 1; r->p++; }
    if (r->p >= r->end) return fail(r, "config is not JSON: bad number");
    if (*r->p == '0') {
        r->p++;
    } else if (*r->p >= '1' && *r->p <= '9') {
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
            if (v > (UINT64_MAX - 9) / 10) integral = 0; /* too large to matter */
            else v = v * 10 + (uint64_t)(*r->p - '0');
            r->p++;
        }
    } else {
        return fail(r, "config is not JSON: bad number");
    }
    if (r->p < r->end && *r->p == '.') {
        integral = 0;
        r->p++;
        if (r->p >= r->end || *r->p < '0' || *r->p > '9') return fail(r, "config is not JSON: bad number");
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    }
    if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
        integral = 0;
        r->p++;
        if (r->p < r->end && (*r->p == '+' || *r->p == '-')) r->p++;
        if (r->p >= r->end || *r->p < '0' || *r->p > '9') return fail(r, "config is not JSON: bad number");
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    }
    (void)start;
    *is_uint = integral && !negative;
    *as_uint = v;
    return 0;
}

static int read_literal(struct reader *r, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n) != 0)
        return fail(r, "config is not JSON: unexpected '%c'", *r->p);
    r->p += n;
    return 0;
}

/* Skips any JSON value (syntax-checked). */
static int skip_value(struct reader *r, int depth) {
    uint64_t u;
    int is_uint;
    skip_ws(r);
    if (r->p >= r->end) return fail(r, "config is not JSON: unexpected end");
    if (depth > MAX_DEPTH) return fail(r, "config nests deeper than %d", MAX_DEPTH);
    switch (*r->p) {
    case '"': return read_string(r, NULL, 0, NULL);
    case 't': return read_literal(r, "true");
    case 'f': return read_literal(r, "false");
    case 'n': return read_literal(r, "null");
    case '{': case '[': {
        char close = *r->p == '{' ? '}' : ']';
        int object = close == '}';
        r->p++;
        skip_ws(r);
        if (r->p < r->end && *r->p == close) { r->p++; return 0; }
        for (;;) {
            if (object) {
                skip_ws(r);
                if (r->p >= r->end || *r->p != '"') return fail(r, "config is not JSON: expected a key");
                if (read_string(r, NULL, 0, NULL)) return -1;
                skip_ws(r);
                if (r->p >= r->end || *r->p != ':') return fail(r, "config is not JSON: expected ':'");
                r->p++;
            }
            if (skip_value(r, depth + 1)) return -1;
            skip_ws(r);
            if (r->p < r->end && *r->p == ',') { r->p++; continue; }
            if (r->p < r->end && *r->p == close) { r->p++; return 0; }
            return fail(r, "config is not JSON: expected ',' or '%c'", close);
        }
    }
    default:
        return read_number(r, &u, &is_uint);
    }
}

#define KNOWN "(known: label, path, timeoutMs)"

/* Reads a string value into `out` (size `out_len`): non-empty, no NUL. */
static int string_value(struct reader *r, const char *key, char *out, size_t out_len) {
    size_t n;
    if (*r->p != '"') return fail(r, "\"%s\" must be a string", key);
    if (read_string(r, out, out_len, &n)) return -1;
    if (n == 0 || strlen(out) != n) return fail(r, "\"%s\" must be a non-empty string", key);
    return 0;
}

int tpl_parse_config(const char *json, size_t len, struct tpl_config *out, char *err, size_t err_len) {
    struct reader rd = { json, json + len, err, err_len };
    struct reader *r = &rd;
    int first = 1;

    memset(out, 0, sizeof *out);
    out->timeout_ms = DEFAULT_TIMEOUT_MS;
    skip_ws(r);
    if (r->p >= r->end || *r->p != '{') {
        /* Check the syntax first so that garbage reads as "not JSON". */
        if (skip_value(r, 0)) return -1;
        return fail(r, "config must be an object with at least \"label\"");
    }
    r->p++;
    for (;;) {
        char key[32];
        size_t key_n;
        skip_ws(r);
        if (first && r->p < r->end && *r->p == '}') { r->p++; break; }
        first = 0;
        if (r->p >= r->end || *r->p != '"') return fail(r, "config is not JSON: expected a key");
        {
            /* Keys longer than any we know are unknown keys, not errors of length. */
            struct reader probe = *r;
            size_t n;
            if (read_string(&probe, NULL, 0, &n)) return -1;
            if (n >= sizeof key) {
                *r = probe;
                return fail(r, "unknown config key " KNOWN);
            }
            if (read_string(r, key, sizeof key, &key_n)) return -1;
        }
        skip_ws(r);
        if (r->p >= r->end || *r->p != ':') return fail(r, "config is not JSON: expected ':'");
        r->p++;
        skip_ws(r);
        if (r->p >= r->end) return fail(r, "config is not JSON: unexpected end");

        if (strcmp(key, "label") == 0) {
            if (string_value(r, key, out->label, sizeof out->label)) return -1;
        } else if (strcmp(key, "path") == 0) {
            if (string_value(r, key, out->path, sizeof out->path)) return -1;
            if (out->path[0] != '/') return fail(r, "path: must start with /, got \"%s\"", out->path);
        } else if (strcmp(key, "timeoutMs") == 0) {
            uint64_t v;
            int is_uint;
            if (!((*r->p >= '0' && *r->p <= '9') || *r->p == '-'))
                return fail(r, "timeoutMs: must be an integer");
            if (read_number(r, &v, &is_uint)) return -1;
            if (!is_uint || v < 1 || v > MAX_TIMEOUT_MS)
                return fail(r, "timeoutMs: must be an integer within 1..%u", MAX_TIMEOUT_MS);
            out->timeout_ms = (uint32_t)v;
        } else {
            /* A typo must fail at load time, not silently mean "defaults". */
            return fail(r, "unknown config key \"%s\" " KNOWN, key);
        }
        skip_ws(r);
        if (r->p < r->end && *r->p == ',') { r->p++; continue; }
        if (r->p < r->end && *r->p == '}') { r->p++; break; }
        return fail(r, "config is not JSON: expected ',' or '}'");
    }
    skip_ws(r);
    if (r->p != r->end) return fail(r, "config is not JSON: trailing characters");
    if (out->label[0] == '\0') return fail(r, "config needs \"label\" (the pod label to read)");
    return 0;
}
