// Hand-written, inside the generated export package
// (bindings/exports/export_portwise_membership_checker, which wit-bindgen go
// leaves to us; guests/go/build keeps this file when it regenerates). The generated
// wasmexport entry points call ValidateConfig and Check in this package; they
// forward to the checker registered with portwise.Register, so that checker
// code lives in an ordinary package of its own.

package export_portwise_membership_checker

import (
	types "github.com/portwise/portwise/guests/go/bindings/imports/portwise_membership_types"
	witTypes "github.com/portwise/portwise/guests/go/third_party/go-pkg/wit/types"
)

// Set by portwise.Register.
var (
	ValidateConfigFunc func(config string) witTypes.Result[witTypes.Unit, string]
	CheckFunc          func(config string, service *types.Service, pod *types.Pod, target types.Target) types.Verdict
)

const unregistered = "no checker registered: call portwise.Register from an init function"

func ValidateConfig(config string) witTypes.Result[witTypes.Unit, string] {
	if ValidateConfigFunc == nil {
		return witTypes.Err[witTypes.Unit, string](unregistered)
	}
	return ValidateConfigFunc(config)
}

func Check(config string, service *types.Service, pod *types.Pod, target types.Target) types.Verdict {
	// The borrows must end before the call returns, or the host rejects the
	// answer ("borrow handles still remain at the end of the call").
	// wit-bindgen-go 0.63.0's entry point does not end them: dropping a
	// borrowed handle does (it does not touch the host's pod or Service).
	defer service.Drop()
	defer pod.Drop()
	if CheckFunc == nil {
		return types.Verdict{Decision: types.Decision_Abstain, Reason: witTypes.Some(unregistered)}
	}
	return CheckFunc(config, service, pod, target)
}
