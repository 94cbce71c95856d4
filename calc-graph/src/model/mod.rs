//! Calico v3 resources, their etcd keys and validation.

pub mod primitives;
