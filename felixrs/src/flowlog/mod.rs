//! Flow logs (issue 27): what is talking to what on this node, and which policy decided.
//!
//! [`record`] is the one record type every producer and reader shares: the agent's collector
//! writes it (JSON lines file, `/flows` stream), `felixrs preview --flows` replays it, and the
//! web view reads it. Its JSON field names follow Calico's Goldmane/Whisker flows, so an
//! operator who knows those reads these.

pub mod record;

pub use record::{FlowAction, FlowEnd, FlowPolicies, FlowRecord, PolicyHit, Reporter};
