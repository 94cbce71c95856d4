//! The agent's in-memory flow hub: the collector publishes each flow record here; the `/flows`
//! stream and the web view read it. Bounded: the last [`FlowHub::recent`] records are kept for
//! a reader that connects late, and a reader too slow for the live stream loses records (counted)
//! rather than holding memory.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::broadcast;

use super::FlowRecord;

/// Records kept for late readers, by default.
pub const DEFAULT_RECENT: usize = 10_000;
/// Records a live reader may fall behind before it loses some.
const LIVE_BUFFER: usize = 4_096;

/// Where flow records meet their readers.
pub struct FlowHub {
    live: broadcast::Sender<Arc<FlowRecord>>,
    recent: Mutex<VecDeque<Arc<FlowRecord>>>,
    recent_cap: usize,
    published: AtomicU64,
    lagged: AtomicU64,
}

impl FlowHub {
    /// A hub keeping the last `recent_cap` records.
    pub fn new(recent_cap: usize) -> Arc<FlowHub> {
        let (live, _) = broadcast::channel(LIVE_BUFFER);
        Arc::new(FlowHub {
            live,
            recent: Mutex::new(VecDeque::with_capacity(recent_cap.min(1024))),
            recent_cap,
            published: AtomicU64::new(0),
            lagged: AtomicU64::new(0),
        })
    }

    /// Hands a record to every live reader and keeps it for late ones.
    pub fn publish(&self, record: FlowRecord) {
        let record = Arc::new(record);
        {
            let mut recent = self.recent.lock().expect("flow hub lock");
            if recent.len() == self.recent_cap {
                recent.pop_front();
            }
            if self.recent_cap > 0 {
                recent.push_back(record.clone());
            }
        }
        self.published.fetch_add(1, Ordering::Relaxed);
        // No live reader is not an error.
        let _ = self.live.send(record);
    }

    /// The kept records, oldest first.
    pub fn recent(&self) -> Vec<Arc<FlowRecord>> {
        self.recent
            .lock()
            .expect("flow hub lock")
            .iter()
            .cloned()
            .collect()
    }

    /// A live reader: every record published from now on (see [`FlowHub::note_lagged`]).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<FlowRecord>> {
        self.live.subscribe()
    }

    /// Counts records a slow live reader lost.
    pub fn note_lagged(&self, n: u64) {
        self.lagged.fetch_add(n, Ordering::Relaxed);
    }

    /// Records published so far.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    /// Records live readers lost by being too slow.
    pub fn lagged(&self) -> u64 {
        self.lagged.load(Ordering::Relaxed)
    }
}
