// Package portwise is a small layer over the bindings that `wit-bindgen go`
// generates for portwise:membership@0.2.1, so that a membership checker in Go
// reads like Go: (value, ok) lookups instead of WIT options, time.Duration
// timeouts, probe failures as errors, and verdict constructors.
//
// A checker is a main package that registers itself from an init function
// (in a reactor the runtime runs init functions, never main):
//
//	type healthy struct{}
//
//	func (healthy) ValidateConfig(raw string) error { return nil }
//
//	func (healthy) Check(in portwise.Input) portwise.Verdict {
//		if _, err := in.Target.HTTPGet("/healthz", time.Second); err != nil {
//			return portwise.FromProbeError(err, "GET /healthz")
//		}
//		return portwise.Include("GET /healthz answered 2xx")
//	}
//
//	func init() { portwise.Register(healthy{}) }
//	func main() {}
//
// The pod and the Service are borrowed from the host for one call: keep
// neither past Check's return.
package portwise

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	witTypes "github.com/portwise/portwise/guests/go/third_party/go-pkg/wit/types"

	checker "github.com/portwise/portwise/guests/go/bindings/exports/export_portwise_membership_checker"
	_ "github.com/portwise/portwise/guests/go/bindings/exports/wit_exports" // the wasmexport entry points
	wlog "github.com/portwise/portwise/guests/go/bindings/imports/portwise_membership_log"
	probes "github.com/portwise/portwise/guests/go/bindings/imports/portwise_membership_probes"
	types "github.com/portwise/portwise/guests/go/bindings/imports/portwise_membership_types"
)

// Checker is what a guest implements.
type Checker interface {
	// ValidateConfig parses the JSON config (`null` when absent) and returns
	// an error for anything wrong with it; the host then rejects the
	// configuration with the error's text. Probes are denied here.
	ValidateConfig(raw string) error
	// Check judges one (Service port, address family, pod).
	Check(in Input) Verdict
}

// Register makes c the component's checker. Call it once, from init.
func Register(c Checker) {
	checker.ValidateConfigFunc = func(config string) (res witTypes.Result[witTypes.Unit, string]) {
		defer func() {
			if p := recover(); p != nil {
				res = witTypes.Err[witTypes.Unit, string](fmt.Sprintf("validate-config panicked: %v", p))
			}
		}()
		if err := c.ValidateConfig(config); err != nil {
			return witTypes.Err[witTypes.Unit, string](err.Error())
		}
		return witTypes.Ok[witTypes.Unit, string](witTypes.Unit{})
	}
	checker.CheckFunc = func(config string, service *types.Service, pod *types.Pod, target types.Target) (v types.Verdict) {
		defer func() {
			if p := recover(); p != nil {
				msg := fmt.Sprintf("check panicked: %v", p)
				Log(LevelError, msg)
				v = Abstain(msg).wit()
			}
		}()
		return c.Check(Input{
			Config:  config,
			Service: Service{service},
			Pod:     Pod{pod},
			Target:  newTarget(target),
		}).wit()
	}
}

// Input is one call's question.
type Input struct {
	// Config is the module's JSON config, the same string on every call.
	Config  string
	Service Service
	Pod     Pod
	Target  Target
}

// --- verdicts ------------------------------------------------------------------

// Decision is a checker's answer.
type Decision uint8

const (
	// DecisionInclude: the pod backs the port.
	DecisionInclude Decision = iota
	// DecisionExclude: the pod does not back the port.
	DecisionExclude
	// DecisionAbstain: the checker cannot tell; the host keeps what it last
	// published for this (pod, port, family).
	DecisionAbstain
)

func (d Decision) String() string {
	switch d {
	case DecisionInclude:
		return "include"
	case DecisionExclude:
		return "exclude"
	}
	return "abstain"
}

// Verdict is a decision with an optional reason (empty: none), which
// `portwise check` and the host's debug log show.
type Verdict struct {
	Decision Decision
	Reason   string
}

func verdict(d Decision, format string, args []any) Verdict {
	if len(args) > 0 {
		format = fmt.Sprintf(format, args...)
	}
	return Verdict{d, format}
}

// Include answers include; the reason is formatted like fmt.Sprintf when
// arguments follow it.
func Include(reason string, args ...any) Verdict { return verdict(DecisionInclude, reason, args) }

// Exclude answers exclude.
func Exclude(reason string, args ...any) Verdict { return verdict(DecisionExclude, reason, args) }

// Abstain answers abstain.
func Abstain(reason string, args ...any) Verdict { return verdict(DecisionAbstain, reason, args) }

func (v Verdict) wit() types.Verdict {
	d := types.Decision_Abstain
	switch v.Decision {
	case DecisionInclude:
		d = types.Decision_Include
	case DecisionExclude:
		d = types.Decision_Exclude
	}
	reason := witTypes.None[string]()
	if v.Reason != "" {
		reason = witTypes.Some(v.Reason)
	}
	return types.Verdict{Decision: d, Reason: reason}
}

// --- the pod and the Service ---------------------------------------------------

func opt(o witTypes.Option[string]) (string, bool) {
	if o.IsSome() {
		return o.Some(), true
	}
	return "", false
}

// Pod is the pod under judgement, borrowed for one call. Every method is one
// host call that copies only its answer: read by key.
type Pod struct{ p *types.Pod }

func (p Pod) Name() string      { return p.p.Name() }
func (p Pod) Namespace() string { return p.p.Namespace() }
func (p Pod) UID() string       { return p.p.Uid() }

// Label returns the value of one label.
func (p Pod) Label(key string) (string, bool) { return opt(p.p.Label(key)) }

// Annotation returns the value of one annotation.
func (p Pod) Annotation(key string) (string, bool) { return opt(p.p.Annotation(key)) }

// Labels copies every label (sorted by key): prefer Label.
func (p Pod) Labels() map[string]string { return kvMap(p.p.Labels()) }

// Annotations copies every annotation, which can be large: prefer Annotation.
func (p Pod) Annotations() map[string]string { return kvMap(p.p.Annotations()) }

// Phase is Pending, Running, Succeeded, Failed or Unknown.
func (p Pod) Phase() string { return p.p.Phase() }

// Terminating reports whether the pod has a deletionTimestamp.
func (p Pod) Terminating() bool { return p.p.Terminating() }

// NodeName is the node the pod was scheduled to.
func (p Pod) NodeName() (string, bool) { return opt(p.p.NodeName()) }

// IPs are status.podIPs, normalised.
func (p Pod) IPs() []string { return p.p.Ips() }

// Condition is a pod condition as the kubelet reports it.
type Condition struct {
	Type, Status, Reason string
}

// Condition returns the condition of one type (Ready, ContainersReady, ...).
func (p Pod) Condition(conditionType string) (Condition, bool) {
	o := p.p.Condition(conditionType)
	if !o.IsSome() {
		return Condition{}, false
	}
	c := o.Some()
	reason, _ := opt(c.Reason)
	return Condition{c.Type, c.Status, reason}, true
}

// Ready reports whether the pod's Ready condition is True (one host call).
// It ignores the Service's publishNotReadyAddresses; PodReady honours it.
func (p Pod) Ready() bool {
	c, ok := p.Condition("Ready")
	return ok && c.Status == "True"
}

// ContainerPort is a port declared by one of the pod's containers.
type ContainerPort struct {
	Container, Name, Protocol string
	Port                      uint16
	Sidecar                   bool
}

// ContainerPort returns the first declared container port with this name.
func (p Pod) ContainerPort(name string) (ContainerPort, bool) {
	o := p.p.ContainerPort(name)
	if !o.IsSome() {
		return ContainerPort{}, false
	}
	c := o.Some()
	n, _ := opt(c.Name)
	return ContainerPort{c.Container, n, c.Protocol, c.Port, c.Sidecar}, true
}

// PodReady is the built-in podReady's answer for the pod under judgement:
// its Ready condition, or always true under the Service's
// publishNotReadyAddresses.
func PodReady() bool { return probes.PodReady() }

// Service is the Service the slices are published for, borrowed like Pod.
type Service struct{ s *types.Service }

func (s Service) Name() string      { return s.s.Name() }
func (s Service) Namespace() string { return s.s.Namespace() }
func (s Service) UID() string       { return s.s.Uid() }

// Label returns the value of one of the Service's labels.
func (s Service) Label(key string) (string, bool) { return opt(s.s.Label(key)) }

// Annotation returns the value of one of the Service's annotations.
func (s Service) Annotation(key string) (string, bool) { return opt(s.s.Annotation(key)) }

func kvMap(kvs []types.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

// --- the target and probes -------------------------------------------------------

// Target is what is judged: one Service port resolved against this pod, in
// one address family.
type Target struct {
	PortName    string // empty when unnamed
	ServicePort uint16
	TargetPort  uint16 // the container port the Service port resolved to
	Protocol    string
	IPv6        bool
	Address     string // the only address probes may reach
}

func newTarget(t types.Target) Target {
	return Target{
		PortName:    t.PortName,
		ServicePort: t.ServicePort,
		TargetPort:  t.TargetPort,
		Protocol:    t.Protocol,
		IPv6:        t.Family == types.AddressFamily_Ipv6,
		Address:     t.Address,
	}
}

// ProbeErrorKind says why a probe failed.
type ProbeErrorKind uint8

const (
	// ProbeTimeout: the timeout (or the host's cap) elapsed first.
	ProbeTimeout ProbeErrorKind = iota
	// ProbeRefused: nothing listens on the port.
	ProbeRefused
	// ProbeDenied: the host refused to run the probe (another address, too
	// many probes in one call, any probe during validate-config).
	ProbeDenied
	// ProbeIO: any other I/O or protocol failure.
	ProbeIO
)

// ProbeError is a failed probe. Probe methods return it as their error.
type ProbeError struct {
	Kind    ProbeErrorKind
	Message string // for ProbeDenied and ProbeIO
}

func (e *ProbeError) Error() string {
	switch e.Kind {
	case ProbeTimeout:
		return "timeout"
	case ProbeRefused:
		return "connection refused"
	case ProbeDenied:
		return "denied: " + e.Message
	}
	return e.Message
}

// Unreachable reports a failure on the prober's own side (no route to the
// pod, no free sockets), which says nothing about the pod.
func (e *ProbeError) Unreachable() bool {
	return e.Kind == ProbeIO && strings.HasPrefix(e.Message, "unreachable:")
}

func probeError(e probes.ProbeError) error {
	switch e.Tag() {
	case probes.ProbeError_Timeout:
		return &ProbeError{Kind: ProbeTimeout}
	case probes.ProbeError_Refused:
		return &ProbeError{Kind: ProbeRefused}
	case probes.ProbeError_Denied:
		return &ProbeError{Kind: ProbeDenied, Message: e.Denied()}
	}
	return &ProbeError{Kind: ProbeIO, Message: e.Io()}
}

// IsTimeout reports whether err is a probe timeout.
func IsTimeout(err error) bool {
	var pe *ProbeError
	return errors.As(err, &pe) && pe.Kind == ProbeTimeout
}

// FromProbeError turns a failed probe into the usual verdict: abstain when
// the failure is not the pod's fault (timeout, denied, the prober's own
// "unreachable:" failures), exclude otherwise (refused, reset, malformed
// answer). what names the probe in the reason, e.g. "GET /healthz".
func FromProbeError(err error, what string) Verdict {
	var pe *ProbeError
	if !errors.As(err, &pe) {
		return Abstain("%s: %v", what, err)
	}
	switch {
	case pe.Kind == ProbeTimeout, pe.Kind == ProbeDenied, pe.Unreachable():
		return Abstain("%s: %v", what, err)
	}
	return Exclude("%s: %v", what, err)
}

// Millis converts a timeout to the probes' milliseconds: rounded up, 0 (the
// host's cap) for d <= 0, saturated at the largest value.
func Millis(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	ms := (d + time.Millisecond - 1) / time.Millisecond
	if ms > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(ms)
}

// TCPDial opens a TCP connection to the target's address and port and closes
// it. A timeout <= 0 means the host's cap.
func (t Target) TCPDial(timeout time.Duration) error {
	return TCPDialPort(t.TargetPort, timeout)
}

// TCPDialPort dials another port of the address under judgement.
func TCPDialPort(port uint16, timeout time.Duration) error {
	r := probes.TcpDial("", port, Millis(timeout))
	if r.IsErr() {
		return probeError(r.Err())
	}
	return nil
}

// HTTPResponse is the answer to an HTTP GET. Redirects are not followed.
type HTTPResponse struct {
	Status    uint16
	Body      []byte // at most MaxBodyBytes
	Truncated bool   // the body was longer than the host returns
}

// OK reports a 2xx status.
func (r HTTPResponse) OK() bool { return r.Status >= 200 && r.Status < 300 }

// HTTPGet sends GET http://<address>:<target port><path>.
func (t Target) HTTPGet(path string, timeout time.Duration) (HTTPResponse, error) {
	return HTTPGetPort(t.TargetPort, path, timeout)
}

// HTTPGetPort sends a GET to another port of the address under judgement.
func HTTPGetPort(port uint16, path string, timeout time.Duration) (HTTPResponse, error) {
	r := probes.HttpGet(probes.HttpRequest{Host: "", Port: port, Path: path, TimeoutMs: Millis(timeout)})
	if r.IsErr() {
		return HTTPResponse{}, probeError(r.Err())
	}
	resp := r.Ok()
	return HTTPResponse{resp.Status, resp.Body, resp.Truncated}, nil
}

// MaxBodyBytes is the largest body HTTPGet returns.
func MaxBodyBytes() uint32 { return probes.MaxBodyBytes() }

// --- logging -------------------------------------------------------------------

// Level is a log level of the host's log stream.
type Level uint8

const (
	LevelTrace Level = iota
	LevelDebug
	LevelInfo
	LevelWarn
	LevelError
)

// Log writes one line to the host's log, tagged with the module, Service,
// pod and port under judgement.
func Log(level Level, message string) {
	l := wlog.Level_Error
	switch level {
	case LevelTrace:
		l = wlog.Level_Trace
	case LevelDebug:
		l = wlog.Level_Debug
	case LevelInfo:
		l = wlog.Level_Info
	case LevelWarn:
		l = wlog.Level_Warn
	}
	wlog.Log(l, message)
}

// Logf formats like fmt.Sprintf and logs.
func Logf(level Level, format string, args ...any) { Log(level, fmt.Sprintf(format, args...)) }

// Cached memoises a config parser on the raw string: the host passes the
// same config on every call, so it is parsed once per instance.
func Cached[T any](parse func(raw string) (T, error)) func(raw string) (T, error) {
	var (
		have bool
		last string
		val  T
		err  error
	)
	return func(raw string) (T, error) {
		if !have || raw != last {
			val, err = parse(raw)
			last, have = raw, true
		}
		return val, err
	}
}
