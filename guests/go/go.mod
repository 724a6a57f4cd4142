module github.com/portwise/portwise/guests/go

go 1.25

// No requirements: the runtime that wit-bindgen go's bindings import
// (go.bytecodealliance.org/pkg v0.4.0, which no module proxy serves) is a
// package of this module, third_party/go-pkg (README.portwise.md there), so a
// checker requires this module alone and needs no replace line.
