// zone-check: a pod backs the port when its zone is one the Service allows
// and the target port answers.
//
// The pod's zone is a pod label (default topology.kubernetes.io/zone; pods
// do not get it from Kubernetes, so a deployment copies it from its Node or
// sets it itself). The allowed zones are the configured `zones`, or, when
// `serviceAnnotation` is set and the Service carries that annotation, the
// annotation's comma-separated list: one module config can then serve
// Services with different zone lists. Once the zone matches, the target port
// is probed: a TCP dial (default), an HTTP GET of `path` that must answer
// 2xx, or nothing.
//
//	config: {zones: [eu-1a, eu-1b], serviceAnnotation: app.example.com/zones,
//	         probe: http, path: /healthz, timeoutMs: 300}
//
// Decisions: exclude when the pod is terminating, has no zone label, or its
// zone is not allowed, when nothing listens or the HTTP status is not 2xx;
// abstain when the probe times out or fails on the prober's side (not the
// pod's fault: the host keeps what it published last); include otherwise.
package main

import (
	"strings"
	"time"

	"github.com/portwise/portwise/guests/go/portwise"
	"github.com/portwise/portwise/guests/go/zone-check/zone"
)

type zoneCheck struct{}

var config = portwise.Cached(zone.Parse)

func (zoneCheck) ValidateConfig(raw string) error {
	_, err := config(raw)
	return err
}

func (zoneCheck) Check(in portwise.Input) portwise.Verdict {
	cfg, err := config(in.Config)
	if err != nil {
		return portwise.Abstain("invalid config: %v", err)
	}
	if in.Pod.Terminating() {
		return portwise.Exclude("pod is terminating")
	}
	podZone, ok := in.Pod.Label(cfg.ZoneLabel)
	if !ok {
		return portwise.Exclude("pod has no label %s", cfg.ZoneLabel)
	}
	var annotation string
	var present bool
	if cfg.ServiceAnnotation != "" {
		annotation, present = in.Service.Annotation(cfg.ServiceAnnotation)
	}
	allowed, from := cfg.Allowed(annotation, present)
	if !zone.Contains(allowed, podZone) {
		return portwise.Exclude("zone %s not in [%s] (%s)", podZone, strings.Join(allowed, " "), from)
	}

	timeout := time.Duration(cfg.TimeoutMs) * time.Millisecond
	port := in.Target.TargetPort
	switch cfg.Probe {
	case zone.ProbeNone:
		return portwise.Include("zone %s", podZone)
	case zone.ProbeHTTP:
		what := "GET " + cfg.Path
		resp, err := in.Target.HTTPGet(cfg.Path, timeout)
		if err != nil {
			return portwise.FromProbeError(err, what)
		}
		if !resp.OK() {
			return portwise.Exclude("zone %s, %s on port %d: %d", podZone, what, port, resp.Status)
		}
		return portwise.Include("zone %s, %s on port %d: %d", podZone, what, port, resp.Status)
	default:
		if err := in.Target.TCPDial(timeout); err != nil {
			return portwise.FromProbeError(err, "TCP dial")
		}
		return portwise.Include("zone %s, port %d accepts TCP", podZone, port)
	}
}

func init() { portwise.Register(zoneCheck{}) }

// main never runs: the component is a reactor, whose runtime runs the init
// functions and then serves the exports.
func main() {}
