/* A strict, allocation-free JSON reader for the checker's small config.
 *
 * wasi-libc has no JSON library and the config is tiny, so the guest carries
 * its own. It accepts exactly RFC 8259 JSON (anything else is a config error,
 * so a broken file is rejected at load time by validate-config rather than
 * misread), bounds nesting depth, and keeps only the three keys it knows. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAX_DEPTH 32
#define MAX_TIMEOUT_MS 60000u

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

int pn_parse_config(const char *json, size_t len, struct pn_config *out, char *err, size_t err_len) {
    struct reader rd = { json, json + len, err, err_len };
    struct reader *r = &rd;
    int have_key = 0, first = 1;

    memset(out, 0, sizeof *out);
    skip_ws(r);
    if (r->p >= r->end || *r->p != '{') {
        /* Check the syntax first so that garbage reads as "not JSON". */
        if (skip_value(r, 0)) return -1;
        return fail(r, "config must be an object with \"annotation\" or \"label\"");
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
                return fail(r, "unknown config key (known: annotation, label, dialTimeoutMs)");
            }
            if (read_string(r, key, sizeof key, &key_n)) return -1;
        }
        skip_ws(r);
        if (r->p >= r->end || *r->p != ':') return fail(r, "config is not JSON: expected ':'");
        r->p++;
        skip_ws(r);
        if (r->p >= r->end) return fail(r, "config is not JSON: unexpected end");

        if (strcmp(key, "annotation") == 0 || strcmp(key, "label") == 0) {
            size_t n;
            if (have_key) return fail(r, "give exactly one of \"annotation\" and \"label\"");
            if (*r->p != '"') return fail(r, "\"%s\" must be a string", key);
            if (read_string(r, out->key, sizeof out->key, &n)) return -1;
            if (n == 0 || strlen(out->key) != n) return fail(r, "\"%s\" must be a non-empty key", key);
            out->source = key[0] == 'a' ? PN_ANNOTATION : PN_LABEL;
            have_key = 1;
        } else if (strcmp(key, "dialTimeoutMs") == 0) {
            uint64_t v;
            int is_uint;
            if (!((*r->p >= '0' && *r->p <= '9') || *r->p == '-'))
                return fail(r, "\"dialTimeoutMs\" must be an integer");
            if (read_number(r, &v, &is_uint)) return -1;
            if (!is_uint || v < 1 || v > MAX_TIMEOUT_MS)
                return fail(r, "\"dialTimeoutMs\" must be an integer within 1..%u", MAX_TIMEOUT_MS);
            out->dial_timeout_ms = (uint32_t)v;
        } else {
            return fail(r, "unknown config key \"%s\" (known: annotation, label, dialTimeoutMs)", key);
        }
        skip_ws(r);
        if (r->p < r->end && *r->p == ',') { r->p++; continue; }
        if (r->p < r->end && *r->p == '}') { r->p++; break; }
        return fail(r, "config is not JSON: expected ',' or '}'");
    }
    skip_ws(r);
    if (r->p != r->end) return fail(r, "config is not JSON: trailing characters");
    if (!have_key) return fail(r, "config needs \"annotation\" or \"label\" (the key listing port names)");
    return 0;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

int pn_list_has(const char *list, size_t list_len, const char *name, size_t name_len) {
    size_t i = 0;
    if (name_len == 0) return 0;
    while (i <= list_len) {
        size_t start = i, end;
        while (i < list_len && list[i] != ',') i++;
        end = i;
        while (start < end && is_space(list[start])) start++;
        while (end > start && is_space(list[end - 1])) end--;
        if (end - start == name_len && memcmp(list + start, name, name_len) == 0) return 1;
        i++; /* past the comma (or the end) */
    }
    return 0;
}
