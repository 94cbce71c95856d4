//! A continuous TCP prober: threads inside one network namespace connect to one address back to
//! back for as long as the value lives, counting attempts and connections that were delivered. A
//! fault test keeps one running from a denied peer for the whole test and reads the counts around
//! each scenario (a delivered connection of a denied peer is a window the agent opened).

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::netns::enter;

/// Attempts and delivered connections so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub attempts: u64,
    pub delivered: u64,
}

impl std::ops::Sub for Counts {
    type Output = Counts;

    fn sub(self, o: Counts) -> Counts {
        Counts {
            attempts: self.attempts - o.attempts,
            delivered: self.delivered - o.delivered,
        }
    }
}

/// See the module docs; stopped and joined on drop.
pub struct Prober {
    stop: Arc<AtomicBool>,
    attempts: Arc<AtomicU64>,
    delivered: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl Prober {
    /// `threads` probers in namespace `from` connecting to `to`, each attempt given `timeout` (a
    /// denied attempt costs all of it; a delivered one is closed at once).
    pub fn start(from: &str, to: SocketAddr, threads: usize, timeout: Duration) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let attempts = Arc::new(AtomicU64::new(0));
        let delivered = Arc::new(AtomicU64::new(0));
        let threads = (0..threads)
            .map(|_| {
                let (stop, a, d) = (stop.clone(), attempts.clone(), delivered.clone());
                let from = from.to_string();
                std::thread::spawn(move || {
                    enter(&from).unwrap_or_else(|e| panic!("prober: {e}"));
                    while !stop.load(Ordering::SeqCst) {
                        let ok = TcpStream::connect_timeout(&to, timeout).is_ok();
                        a.fetch_add(1, Ordering::SeqCst);
                        if ok {
                            d.fetch_add(1, Ordering::SeqCst);
                            // An admitted peer's prober need not hammer the server.
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                })
            })
            .collect();
        Prober {
            stop,
            attempts,
            delivered,
            threads,
        }
    }

    pub fn counts(&self) -> Counts {
        Counts {
            attempts: self.attempts.load(Ordering::SeqCst),
            delivered: self.delivered.load(Ordering::SeqCst),
        }
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
