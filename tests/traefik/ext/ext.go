// Package ext stands in for Traefik's github.com/traefik/traefik/dynamic/ext,
// a nested module of the Traefik repository that the v3 module requires at
// a zero pseudo-version and points at its own folder with a replace: the
// module proxy does not serve it and the v3 module's zip leaves it out. In
// open-source Traefik its types are empty extension points that
// pkg/config/dynamic embeds (the HTTP configuration and a router); nothing
// else of Traefik uses them.
package ext

// HTTP is embedded in dynamic.HTTPConfiguration; empty in open-source Traefik.
type HTTP struct{}

// Router is embedded in dynamic.Router; empty in open-source Traefik.
type Router struct{}
