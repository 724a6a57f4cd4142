// A membership checker of its own: copy this directory to start (README.md).
// The helper package is portwise's guests/go module, whose versions are the
// repository's tags guests/go/vX.Y.Z, served by the Go module proxy.
module my-checker

go 1.25

require github.com/portwise/portwise/guests/go v0.2.0

// For this repository's own build of the template (guests/build go): the
// helper from the checkout. Delete this line in your copy; the helper then
// comes from the module proxy.
replace github.com/portwise/portwise/guests/go => ../../go
