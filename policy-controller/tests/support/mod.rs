//! Shared test helpers.
#![allow(dead_code)]

pub mod etcd;
pub mod fake_apiserver;
