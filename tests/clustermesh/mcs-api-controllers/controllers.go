// Package controllers stands in for sigs.k8s.io/mcs-api/controllers, a
// nested module of sigs.k8s.io/mcs-api that the Go module proxy does not
// serve (404 for every version). Cilium v1.20.2 uses one identifier of it,
// the annotation below (its value as upstream's controllers/common.go
// spells it), and only in the MCS-API controllers, which the ClusterMesh
// test leaves disabled.
package controllers

// DerivedServiceAnnotation is set on a ServiceImport to reference the
// derived Service that represents the imported service for kube-proxy.
const DerivedServiceAnnotation = "multicluster.kubernetes.io/derived-service"
