//! The integration suite: one test binary (linking wasmtime, kube and the
//! support crate once, not once per file), one module per subject. Filters
//! work as before: `./test -- seed` runs `seed::*`, `./test -- ship::helm` the
//! chart tests.

mod abstain;
mod admission;
mod alignment;
mod bad_targets;
mod caches;
mod chaos;
mod checkers;
mod chunking;
mod cilium;
mod clustermesh;
mod collisions;
mod conditions;
mod config;
mod config_reload;
mod consumers;
mod demo;
mod dual_stack;
mod endpoint_fields;
mod envoy_gateway;
mod faults;
mod isolation;
mod istiod;
mod leader_election;
mod legacy_endpoints;
mod migration;
mod oci;
mod oracle;
mod other_writers;
mod partitions;
mod policies;
mod policy_crd;
mod policy_objects;
mod probe_fields;
mod probes;
mod prometheus;
mod repair;
mod seed;
mod shadow;
mod shards;
mod ship;
mod stable;
mod support;
mod target_ports;
mod traefik;
mod trigger_time;
mod wire;
mod workflows;
mod write_guards;
mod writes;
