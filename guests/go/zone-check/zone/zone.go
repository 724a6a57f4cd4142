// Package zone is the pure part of the zone-check guest: its configuration
// and the zone rules. It imports nothing from the WebAssembly bindings, so
// `go test` runs it natively (guests/go/build does, before building).
package zone

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// DefaultZoneLabel is the well-known topology label. Pods do not get it
// from Kubernetes (Nodes do), so a deployment that wants this check copies it
// onto its pods, or names another label.
const DefaultZoneLabel = "topology.kubernetes.io/zone"

// Probe kinds.
const (
	ProbeTCP  = "tcp"
	ProbeHTTP = "http"
	ProbeNone = "none"
)

// Config is the guest's JSON configuration.
type Config struct {
	// ZoneLabel is the pod label that holds the pod's zone.
	ZoneLabel string `json:"zoneLabel"`
	// Zones are the zones whose pods may back the port.
	Zones []string `json:"zones"`
	// ServiceAnnotation, when set and present on the Service, replaces
	// Zones for that Service: a comma-separated list of zones.
	ServiceAnnotation string `json:"serviceAnnotation"`
	// Probe is how the target port is tried once the zone matches.
	Probe string `json:"probe"`
	// Path is the HTTP GET path (probe "http" only).
	Path string `json:"path"`
	// TimeoutMs is the probe's timeout in milliseconds.
	TimeoutMs int `json:"timeoutMs"`
}

// Known lists the accepted keys, for error messages.
const Known = "zoneLabel, zones, serviceAnnotation, probe, path, timeoutMs"

// Parse decodes and validates a configuration, filling in defaults. Unknown
// keys, wrong types, trailing data and out-of-range values are errors.
func Parse(raw string) (Config, error) {
	cfg := Config{ZoneLabel: DefaultZoneLabel, Probe: ProbeTCP, TimeoutMs: 500}
	if strings.TrimSpace(raw) == "null" {
		return cfg, errors.New("config is required: {\"zones\": [...]} at least")
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		var typeErr *json.UnmarshalTypeError
		msg := err.Error()
		switch {
		case strings.HasPrefix(msg, "json: unknown field "):
			return cfg, fmt.Errorf("unknown config key %s (known: %s)", strings.TrimPrefix(msg, "json: unknown field "), Known)
		case errors.As(err, &typeErr) && typeErr.Field == "":
			return cfg, fmt.Errorf("config must be a JSON object, not %s", typeErr.Value)
		}
		return cfg, fmt.Errorf("config: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return cfg, errors.New("config: trailing data after the JSON object")
	}
	// Decoding succeeded, so this does too; it tells which keys were given.
	var seen map[string]json.RawMessage
	_ = json.Unmarshal([]byte(raw), &seen)
	for key, value := range seen {
		if bytes.Equal(bytes.TrimSpace(value), []byte("null")) {
			return cfg, fmt.Errorf("config key %q is null", key)
		}
	}
	if cfg.ZoneLabel == "" {
		return cfg, errors.New("zoneLabel must not be empty")
	}
	if len(cfg.Zones) == 0 {
		return cfg, errors.New("zones must list at least one zone")
	}
	for _, z := range cfg.Zones {
		if z == "" || strings.ContainsAny(z, " \t\n,") {
			return cfg, fmt.Errorf("zone %q: zones are non-empty, without spaces or commas", z)
		}
	}
	switch cfg.Probe {
	case ProbeTCP, ProbeNone:
		if _, set := seen["path"]; set {
			return cfg, fmt.Errorf("path is only for probe %q", ProbeHTTP)
		}
	case ProbeHTTP:
		if cfg.Path == "" {
			cfg.Path = "/healthz"
		}
		if !strings.HasPrefix(cfg.Path, "/") {
			return cfg, fmt.Errorf("path %q must start with /", cfg.Path)
		}
	default:
		return cfg, fmt.Errorf("probe %q: want %q, %q or %q", cfg.Probe, ProbeTCP, ProbeHTTP, ProbeNone)
	}
	if cfg.TimeoutMs < 1 || cfg.TimeoutMs > 10000 {
		return cfg, fmt.Errorf("timeoutMs %d: want 1..10000", cfg.TimeoutMs)
	}
	return cfg, nil
}

// Allowed returns the zones allowed for a Service: its annotation's list when
// the configuration names one and the Service carries it, else the
// configured zones. The second result says where the list came from.
func (c Config) Allowed(annotation string, present bool) ([]string, string) {
	if c.ServiceAnnotation == "" || !present {
		return c.Zones, "config"
	}
	var zones []string
	for _, z := range strings.Split(annotation, ",") {
		if z = strings.TrimSpace(z); z != "" {
			zones = append(zones, z)
		}
	}
	return zones, "Service annotation " + c.ServiceAnnotation
}

// Contains reports whether zone is in zones.
func Contains(zones []string, zone string) bool {
	for _, z := range zones {
		if z == zone {
			return true
		}
	}
	return false
}
