//! The NFQUEUE loop: binds `--dns-queue-num` (nfq crate) and decides every held DNS response.
//!
//! Its own thread, blocking on the queue's netlink socket: the first packet wakes it, everything
//! else already queued is taken without blocking (up to [`BATCH`]), the batch is learned and
//! written to the kernel in one go, then every packet gets its verdict. The queue is never set
//! fail-open: when the agent is slow the kernel queue fills and the kernel drops new responses
//! (clients retry), when no one is bound (agent down) the kernel drops them too (the rule has no
//! `--queue-bypass`). The socket lives in the network namespace of the thread that calls
//! [`QueueLoop::bind`].
//!
//! Stopping: [`QueueLoop::stop`] sets a flag the loop reads after each batch; a thread blocked on
//! an idle queue stays blocked until the next packet (or the process exits, which unbinds the
//! queue in the kernel). The nfq crate exposes no file descriptor to poll.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nfq::{Queue, Verdict as NfVerdict};

use super::learner::{Learner, Verdict};
use super::metrics::DROP_VERDICT_FAILED;

/// Packets decided together at most.
pub const BATCH: usize = 64;
/// The kernel queue's length (packets waiting for the agent); beyond it the kernel drops.
pub const QUEUE_MAX_LEN: u32 = 4096;

/// A bound queue, not yet running.
pub struct QueueLoop {
    queue: Queue,
    num: u16,
}

/// The running loop (detached: see the module docs on stopping).
pub struct QueueThread {
    stop: Arc<AtomicBool>,
}

impl QueueLoop {
    /// Opens a netfilter queue socket and binds queue `num`, fail-closed.
    pub fn bind(num: u16) -> io::Result<QueueLoop> {
        let mut queue = Queue::open()?;
        queue
            .bind(num)
            .map_err(|e| io::Error::new(e.kind(), format!("binding NFQUEUE {num}: {e}")))?;
        queue.set_fail_open(num, false)?;
        queue.set_queue_max_len(num, QUEUE_MAX_LEN)?;
        Ok(QueueLoop { queue, num })
    }

    /// Runs the loop on its own thread.
    pub fn spawn(self, learner: Arc<Learner>) -> QueueThread {
        QueueThread::spawn(move |stop| self.run(&learner, stop))
    }

    fn run(mut self, learner: &Learner, stop: &AtomicBool) {
        tracing::info!(
            queue = self.num,
            "holding DNS responses until their addresses are allowed"
        );
        let mut errors_logged = 0u32;
        while !stop.load(Ordering::SeqCst) {
            self.queue.set_nonblocking(false);
            let first = match self.queue.recv() {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    // ENOSPC (a message larger than the buffer) and the like: the packet is lost
                    // to us and dropped by the kernel when it times out of the queue. Never spin.
                    if errors_logged < 10 {
                        tracing::warn!(%error, queue = self.num, "NFQUEUE receive failed");
                        errors_logged += 1;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let mut batch = vec![(Instant::now(), first)];
            self.queue.set_nonblocking(true);
            while batch.len() < BATCH {
                match self.queue.recv() {
                    Ok(m) => batch.push((Instant::now(), m)),
                    Err(_) => break,
                }
            }
            let payloads: Vec<&[u8]> = batch.iter().map(|(_, m)| m.get_payload()).collect();
            let verdicts = learner.handle(&payloads);
            drop(payloads);
            for ((received, mut msg), verdict) in batch.into_iter().zip(verdicts) {
                msg.set_verdict(match verdict {
                    Verdict::Release => NfVerdict::Accept,
                    Verdict::Drop(reason) => {
                        learner.metrics.dropped(reason);
                        NfVerdict::Drop
                    }
                });
                match self.queue.verdict(msg) {
                    Ok(()) => {
                        learner.metrics.responses_held.inc();
                        learner
                            .metrics
                            .hold_seconds
                            .observe(received.elapsed().as_secs_f64());
                    }
                    Err(error) => {
                        learner.metrics.dropped(DROP_VERDICT_FAILED);
                        tracing::warn!(%error, "NFQUEUE verdict failed; the kernel drops the response");
                    }
                }
            }
        }
        let _ = self.queue.unbind(self.num);
        learner.metrics.queue_bound.set(0);
    }
}

/// Binds queue `num` and runs the loop on its own thread, once the learner knows the kernel's
/// domain sets (after the agent's first successful apply: bound earlier, it would release
/// responses unlearned after a restart, denying the connections that follow them); while binding
/// fails (another process holds the queue, or the kernel refuses) it logs and retries every 5 s.
/// Responses meanwhile are dropped by the kernel (no one bound, no bypass): delayed, never let
/// through unlearned.
pub fn spawn_retrying(num: u16, learner: Arc<Learner>) -> QueueThread {
    QueueThread::spawn(move |stop| {
        let mut attempts = 0u64;
        while !learner.programmed() {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            std::thread::park_timeout(Duration::from_millis(20));
        }
        while !stop.load(Ordering::SeqCst) {
            match QueueLoop::bind(num) {
                Ok(q) => {
                    q.run(&learner, stop);
                    return;
                }
                Err(error) => {
                    if attempts.is_multiple_of(12) {
                        tracing::error!(%error, queue = num, "cannot hold DNS responses; the kernel drops them until the queue is bound (retrying every 5 s)");
                    }
                    attempts += 1;
                    std::thread::park_timeout(Duration::from_secs(5));
                }
            }
        }
    })
}

impl QueueThread {
    /// Runs `body` on the queue thread, with the flag [`QueueThread::stop`] sets.
    fn spawn(body: impl FnOnce(&AtomicBool) + Send + 'static) -> QueueThread {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::Builder::new()
            .name("dns-queue".into())
            .spawn(move || body(&flag))
            .expect("spawn dns queue thread");
        QueueThread { stop }
    }

    /// Asks the loop to stop after its current batch (see the module docs).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
