/* Native unit test of the config parser: guests/build-polyglot runs it with
 * the build machine's cc before building the guest (or: cc config.c
 * config_test.c -o t && ./t). */
#include <stdio.h>
#include <string.h>

#include "config.h"

static int failures;

static void expect_ok(const char *json, const char *label, const char *path, uint32_t timeout) {
    struct tpl_config c;
    char err[256];
    if (tpl_parse_config(json, strlen(json), &c, err, sizeof err) != 0) {
        printf("FAIL %s: rejected: %s\n", json, err);
        failures++;
    } else if (strcmp(c.label, label) || strcmp(c.path, path) || c.timeout_ms != timeout) {
        printf("FAIL %s: got label=%s path=%s timeout=%u\n", json, c.label, c.path, c.timeout_ms);
        failures++;
    }
}

static void expect_err(const char *json, const char *needle) {
    struct tpl_config c;
    char err[256];
    if (tpl_parse_config(json, strlen(json), &c, err, sizeof err) == 0) {
        printf("FAIL %s: accepted\n", json);
        failures++;
    } else if (!strstr(err, needle)) {
        printf("FAIL %s: message %s lacks %s\n", json, err, needle);
        failures++;
    }
}

int main(void) {
    expect_ok("{\"label\": \"app\"}", "app", "", 1000);
    expect_ok("{\"label\":\"a/b\",\"path\":\"/healthz\",\"timeoutMs\":300}", "a/b", "/healthz", 300);
    expect_err("null", "label");
    expect_err("{}", "label");
    expect_err("{\"label\": \"app\", \"lable\": 1}", "unknown config key \"lable\"");
    expect_err("{\"label\": \"\"}", "non-empty");
    expect_err("{\"label\": \"app\", \"path\": \"healthz\"}", "must start with /");
    expect_err("{\"label\": \"app\", \"timeoutMs\": 0}", "1..60000");
    expect_err("{\"label\": \"app\", \"timeoutMs\": 1.5}", "1..60000");
    expect_err("{\"label\": \"app\"", "not JSON");
    expect_err("{\"label\": \"app\"} x", "trailing");
    if (failures) return 1;
    printf("config_test: ok\n");
    return 0;
}
