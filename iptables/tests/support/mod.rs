//! Shared helpers of the applier's root tests (network namespaces, hand-built desired states,
//! kernel checks).

#![allow(dead_code)]

pub mod check;
pub mod desired;
pub mod netns;
pub mod tcp;
