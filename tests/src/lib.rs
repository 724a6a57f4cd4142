//! Test support: local control plane, namespaces, pods, listeners.
