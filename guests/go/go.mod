module github.com/portwise/portwise/guests/go

go 1.25

require go.bytecodealliance.org/pkg v0.4.0

// The Go module proxy serves no version of go.bytecodealliance.org/pkg (404),
// so the copy that wit-bindgen-go 0.63.0 was built against (the crate's
// src/pkg, REMOTE_PKG_VERSION v0.4.0) is vendored here; see
// third_party/go-pkg/README.portwise.md.
replace go.bytecodealliance.org/pkg => ./third_party/go-pkg
