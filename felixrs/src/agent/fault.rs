//! Test-only faults of the apply thread, for the liveness tests of the real binary (debug builds
//! only: a release build has neither the module nor the variables).
//!
//! * `FELIXRS_TEST_APPLY_FAULT=panic`: the first apply panics; `=hang`: it never returns.
//! * `FELIXRS_TEST_LIVENESS_STALE_MS=<ms>`: the heartbeat's stale bound instead of
//!   [`STALE_AFTER`](super::liveness::STALE_AFTER).

use std::time::Duration;

use calc_graph::proto::Output;

use super::apply_loop::{ApplyReport, Dataplane, DataplaneError, Drift};

/// What the first apply does instead of applying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Panic,
    Hang,
}

/// The fault asked for in the environment, if any.
pub fn from_env() -> Option<Fault> {
    match std::env::var("FELIXRS_TEST_APPLY_FAULT").ok()?.as_str() {
        "panic" => Some(Fault::Panic),
        "hang" => Some(Fault::Hang),
        other => panic!("FELIXRS_TEST_APPLY_FAULT: unknown fault {other:?}"),
    }
}

/// The stale bound asked for in the environment, if any.
pub fn stale_after_from_env() -> Option<Duration> {
    let ms = std::env::var("FELIXRS_TEST_LIVENESS_STALE_MS").ok()?;
    let ms: u64 = ms
        .parse()
        .unwrap_or_else(|e| panic!("FELIXRS_TEST_LIVENESS_STALE_MS {ms:?}: {e}"));
    Some(Duration::from_millis(ms))
}

/// A dataplane whose first apply fails as `fault` says.
pub struct Faulty<D> {
    pub inner: D,
    pub fault: Fault,
}

impl<D: Dataplane> Dataplane for Faulty<D> {
    fn apply(&mut self, _outputs: Vec<Output>) -> Result<ApplyReport, DataplaneError> {
        match self.fault {
            Fault::Panic => panic!("injected fault: FELIXRS_TEST_APPLY_FAULT=panic"),
            Fault::Hang => loop {
                std::thread::park();
            },
        }
    }
    fn refresh(&mut self) -> Result<ApplyReport, DataplaneError> {
        self.inner.refresh()
    }
    fn prepare(&mut self) {
        self.inner.prepare();
    }
    fn check_drift(&mut self) -> Result<Drift, DataplaneError> {
        self.inner.check_drift()
    }
}
