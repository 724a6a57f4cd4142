// A membership checker of its own: copy this directory to start (README.md).
// The helper package is portwise's guests/go module, whose versions are the
// repository's tags guests/go/vX.Y.Z. Its bindings need
// go.bytecodealliance.org/pkg, which the Go module proxy does not serve: the
// helper vendors it, and a replace in a dependency does not apply to the
// module that requires it, so both replace lines point at a copy of guests/go
// (a clone of the repository at that tag).
module my-checker

go 1.25

require github.com/portwise/portwise/guests/go v0.2.0

require go.bytecodealliance.org/pkg v0.4.0 // indirect

replace github.com/portwise/portwise/guests/go => ../../go

// The bindings' one dependency, vendored in the helper module: a replace in a
// dependency does not apply to the module that requires it, so it is repeated.
replace go.bytecodealliance.org/pkg => ../../go/third_party/go-pkg
