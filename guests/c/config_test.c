/* Native unit test of the config parser: `cc config.c config_test.c && ./a.out`.
 * Run by guests/build-polyglot before the guest is built. */
#include "config.h"

#include <stdio.h>
#include <string.h>

static int failures;

static void expect_ok(const char *json, enum pn_source src, const char *key, uint32_t dial) {
    struct pn_config c;
    char err[256];
    if (pn_parse_config(json, strlen(json), &c, err, sizeof err) != 0) {
        printf("FAIL %s: rejected: %s\n", json, err);
        failures++;
    } else if (c.source != src || strcmp(c.key, key) != 0 || c.dial_timeout_ms != dial) {
        printf("FAIL %s: parsed as source=%d key=%s dial=%u\n", json, c.source, c.key, c.dial_timeout_ms);
        failures++;
    }
}

static void expect_err(const char *json, const char *needle) {
    struct pn_config c;
    char err[256];
    if (pn_parse_config(json, strlen(json), &c, err, sizeof err) == 0) {
        printf("FAIL %s: accepted\n", json);
        failures++;
    } else if (strstr(err, needle) == NULL) {
        printf("FAIL %s: message %s lacks %s\n", json, err, needle);
        failures++;
    }
}

static void expect_list(const char *list, const char *name, int want) {
    if (pn_list_has(list, strlen(list), name, strlen(name)) != want) {
        printf("FAIL list %s has %s: want %d\n", list, name, want);
        failures++;
    }
}

int main(void) {
    expect_ok("{\"annotation\":\"example.com/ports\"}", PN_ANNOTATION, "example.com/ports", 0);
    expect_ok(" { \"label\" : \"ports\" , \"dialTimeoutMs\" : 250 } ", PN_LABEL, "ports", 250);
    expect_ok("{\"label\":\"a\\u00e9\\/b\"}", PN_LABEL, "a\xc3\xa9/b", 0);
    expect_ok("{\"label\":\"\\ud83d\\ude00\"}", PN_LABEL, "\xf0\x9f\x98\x80", 0);

    expect_err("null", "must be an object");
    expect_err("[1,2]", "must be an object");
    expect_err("{}", "needs \"annotation\" or \"label\"");
    expect_err("{\"annotation\":\"a\",\"label\":\"b\"}", "exactly one");
    expect_err("{\"annotation\":\"\"}", "non-empty");
    expect_err("{\"annotation\":7}", "must be a string");
    expect_err("{\"label\":\"p\",\"dialTimeoutMs\":0}", "1..60000");
    expect_err("{\"label\":\"p\",\"dialTimeoutMs\":1.5}", "1..60000");
    expect_err("{\"label\":\"p\",\"dialTimeoutMs\":\"5\"}", "must be an integer");
    expect_err("{\"label\":\"p\",\"dialTimeoutMs\":99999999999999999999}", "1..60000");
    expect_err("{\"labels\":\"p\"}", "unknown config key \"labels\"");
    expect_err("{\"label\":\"p\"", "not JSON");
    expect_err("{\"label\":\"p\"} x", "trailing");
    expect_err("{\"label\":\"\\ud800\"}", "surrogate");
    expect_err("{\"label\":\"a\x01\"}", "control character");
    expect_err("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]", "deeper");
    expect_err("", "not JSON");

    expect_list("http, metrics ,admin", "metrics", 1);
    expect_list("http,metrics", "http", 1);
    expect_list("http,metrics", "admin", 0);
    expect_list("http,metrics", "", 0);
    expect_list("", "http", 0);
    expect_list("https", "http", 0);
    expect_list(" http ", "http", 1);
    expect_list(",,http,", "http", 1);

    if (failures) {
        printf("0 passed, %d failed\n", failures);
        return 1;
    }
    printf("config_test: ok\n");
    return 0;
}
