//! `felixrs agent`: keeps this node's kernel equal to what the datastore says for it.
//!
//! # Layout
//! * [`datastore`]: the `Datastore` seam and its etcd implementation.
//! * [`syncer`]: list + watch + reconnect/resync, emitting [`syncer::SyncEvent`]s.
//! * [`state`]: the raw key -> value view fed into the calculation graph (`Pipeline` seam).
//! * [`apply_loop`]: the thread that owns the dataplane and coalesces applies.
//! * [`snapshot`]: the persisted, checksummed snapshot of the last in-sync datastore view.
//! * [`status`], [`metrics`]: HTTP status/health and Prometheus metrics.
//! * [`runtime`]: wires the tasks together.

pub mod apply_loop;
pub mod datastore;
pub mod metrics;
pub mod runtime;
pub mod snapshot;
pub mod state;
pub mod status;
pub mod syncer;
