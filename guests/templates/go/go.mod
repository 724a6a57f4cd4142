// A membership checker of its own: copy this directory to start (README.md).
// The helper package comes from portwise's guests/go module, by path: point
// both replace lines at your copy of that directory.
module my-checker

go 1.25

require portwise/guests/go v0.0.0

require go.bytecodealliance.org/pkg v0.4.0 // indirect

replace portwise/guests/go => ../../go

// The bindings' one dependency, vendored in the helper module: a replace in a
// dependency does not apply to the module that requires it, so it is repeated.
replace go.bytecodealliance.org/pkg => ../../go/third_party/go-pkg
