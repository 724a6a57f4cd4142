package zone

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseDefaults(t *testing.T) {
	cfg, err := Parse(`{"zones": ["eu-1a", "eu-1b"]}`)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{ZoneLabel: DefaultZoneLabel, Zones: []string{"eu-1a", "eu-1b"}, Probe: ProbeTCP, TimeoutMs: 500}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("got %+v, want %+v", cfg, want)
	}
	cfg, err = Parse(`{"zones": ["a"], "probe": "http", "timeoutMs": 200}`)
	if err != nil || cfg.Path != "/healthz" || cfg.TimeoutMs != 200 {
		t.Fatalf("got %+v, %v", cfg, err)
	}
}

func TestParseRejects(t *testing.T) {
	for raw, want := range map[string]string{
		`null`:                             "config is required",
		`[]`:                               "must be a JSON object",
		`{"zones": ["a"], "zone": "a"}`:    `unknown config key "zone" (known: zoneLabel`,
		`{"zones": []}`:                    "at least one zone",
		`{"zones": ["a b"]}`:               "without spaces",
		`{"zones": ["a,b"]}`:               "commas",
		`{"zones": "a"}`:                   "config: json: cannot unmarshal",
		`{"zones": ["a"], "probe": "udp"}`: `probe "udp"`,
		`{"zones": ["a"], "path": "/x"}`:   "path is only for probe",
		`{"zones": ["a"], "probe": "http", "path": "x"}`: "must start with /",
		`{"zones": ["a"], "timeoutMs": 0}`:               "timeoutMs 0",
		`{"zones": ["a"], "timeoutMs": 20000}`:           "timeoutMs 20000",
		`{"zones": ["a"], "zoneLabel": ""}`:              "zoneLabel must not be empty",
		`{"zones": ["a"], "probe": null}`:                `"probe" is null`,
		`{"zones": ["a"]} {}`:                            "trailing data",
	} {
		_, err := Parse(raw)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%s) = %v, want an error containing %q", raw, err, want)
		}
	}
}

func TestAllowed(t *testing.T) {
	cfg := Config{Zones: []string{"a"}, ServiceAnnotation: "example.com/zones"}
	if z, from := cfg.Allowed("", false); !reflect.DeepEqual(z, []string{"a"}) || from != "config" {
		t.Fatal(z, from)
	}
	if z, _ := cfg.Allowed(" b, c ,,", true); !reflect.DeepEqual(z, []string{"b", "c"}) {
		t.Fatal(z)
	}
	if z, _ := cfg.Allowed("", true); len(z) != 0 {
		t.Fatal(z)
	}
	cfg.ServiceAnnotation = ""
	if z, _ := cfg.Allowed("b", true); !reflect.DeepEqual(z, []string{"a"}) {
		t.Fatal(z)
	}
	if !Contains([]string{"a", "b"}, "b") || Contains([]string{"a"}, "") {
		t.Fatal("Contains")
	}
}
