//! Applier: desired state to the kernel, transactionally.
