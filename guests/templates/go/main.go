// A starter membership checker in Go: copy this directory and put your own
// logic where the comments say so.
//
// What it does as it stands: a pod backs the port when it carries the
// configured label (any value but "false") and the target port answers a
// probe: an HTTP GET of `path` answering 2xx when `path` is set, a TCP dial
// otherwise. A refused connection or another status excludes; a timeout
// abstains (not the pod's fault: portwise keeps what it published last).
//
//	config: {label: app.example.com/serve, path: /healthz, timeoutMs: 1000}
//
// It is a module of its own (go.mod), on the helper package portwise of
// portwise's guests/go module, which wraps the committed bindings and ends
// the pod and Service borrows before Check returns. ./build makes the
// component. See README.md.
package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/portwise/portwise/guests/go/portwise"
)

// config is the `config:` value of the portwise config file. Add your own
// keys here.
type config struct {
	Label     string  `json:"label"`
	Path      *string `json:"path"`
	TimeoutMs int     `json:"timeoutMs"`
}

// parse reads and checks the config. Put every rule here, so that
// ValidateConfig rejects what Check could not use.
func parse(raw string) (config, error) {
	cfg := config{TimeoutMs: 1000}
	dec := json.NewDecoder(strings.NewReader(raw))
	// A typo must fail at load time, not silently mean "defaults".
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return cfg, fmt.Errorf("invalid config: %v", err)
	}
	if dec.More() {
		return cfg, fmt.Errorf("invalid config: trailing data")
	}
	if cfg.Label == "" { // also a `null` config
		return cfg, fmt.Errorf(`config needs "label" (the pod label to read), a non-empty string`)
	}
	if cfg.Path != nil && !strings.HasPrefix(*cfg.Path, "/") {
		return cfg, fmt.Errorf("path: must start with /, got %q", *cfg.Path)
	}
	if cfg.TimeoutMs < 1 || cfg.TimeoutMs > 60000 {
		return cfg, fmt.Errorf("timeoutMs: must be within 1..60000, got %d", cfg.TimeoutMs)
	}
	return cfg, nil
}

// The host passes the same config string on every call: parse it once.
var configFor = portwise.Cached(parse)

type myChecker struct{}

func (myChecker) ValidateConfig(raw string) error {
	_, err := configFor(raw)
	return err
}

func (myChecker) Check(in portwise.Input) portwise.Verdict {
	cfg, err := configFor(in.Config)
	if err != nil {
		// Never guess with a config ValidateConfig would reject.
		return portwise.Abstain("bad config: %v", err)
	}

	// 1. Facts about the pod: one host call per by-key query. Replace or
	//    extend this with your own rules (in.Pod.Annotation, in.Pod.Condition,
	//    in.Service.Annotation, ...).
	value, ok := in.Pod.Label(cfg.Label)
	if !ok {
		return portwise.Exclude("pod has no label %s", cfg.Label)
	}
	if value == "false" {
		return portwise.Exclude("label %s=false", cfg.Label)
	}

	// 2. One probe of the address under judgement (the host reaches no
	//    other), and 3. the verdict, with a reason (`portwise check` and the
	//    debug log show it). Change the path, the port or what counts as
	//    healthy here. FromProbeError abstains on a timeout, a denied probe
	//    and the prober's own "unreachable:" failures, and excludes otherwise.
	//    The kubelet's other probes (WIT 0.2.1) are in the generated
	//    bindings (guests/go/bindings/imports/portwise_membership_probes):
	//    HttpGetWith(request, HttpOptions{Tls: true, Headers: ...}) for
	//    HTTPS with headers, and GrpcHealth("", port, "my.Service", ms) for
	//    grpc.health.v1 (SERVING is the one healthy answer).
	timeout := time.Duration(cfg.TimeoutMs) * time.Millisecond
	port := in.Target.TargetPort
	if cfg.Path != nil {
		what := fmt.Sprintf("GET %s on port %d", *cfg.Path, port)
		resp, err := in.Target.HTTPGet(*cfg.Path, timeout)
		if err != nil {
			return portwise.FromProbeError(err, what)
		}
		if !resp.OK() {
			return portwise.Exclude("%s: %d", what, resp.Status)
		}
		return portwise.Include("label %s=%s, %s: %d", cfg.Label, value, what, resp.Status)
	}
	what := fmt.Sprintf("TCP dial of port %d", port)
	if err := in.Target.TCPDial(timeout); err != nil {
		return portwise.FromProbeError(err, what)
	}
	return portwise.Include("label %s=%s, %s: connected", cfg.Label, value, what)
}

func init() { portwise.Register(myChecker{}) }

// main never runs: the component is a reactor, whose runtime runs the init
// functions and then serves the exports.
func main() {}
