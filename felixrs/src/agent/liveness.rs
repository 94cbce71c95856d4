//! Whether the apply thread is alive: the heartbeat behind `/liveness` and the runtime's watch.
//!
//! The apply thread beats while it waits for work (at least every [`TICK`]) and around every
//! command its dataplane runs ([`BeatingRunner`]: `iptables-restore`, `ipset`, the saves, also
//! those of the read ahead at restart). So the longest legitimate silence is one command (an
//! `iptables-restore` may wait [`LOCK_WAIT_SECS`](iptables::apply::backend::LOCK_WAIT_SECS) = 10 s
//! for the xtables lock, then write a whole table: ~0.5 s at 50k rules) or the CPU work between
//! two commands (rendering and planning a first apply of 50k rules: ~0.7 s on the benchmark
//! node). Every apply of the tests and benchmarks stays under 1 s; [`STALE_AFTER`] is 60 s,
//! five times the worst lock wait plus a slow write, so a loaded node is never called dead.
//!
//! The apply thread's end (a panic, or a return) is recorded at once with its cause: `/liveness`
//! answers 503 naming it, and the runtime stops the agent with a non-zero exit. A heartbeat older
//! than the bound (the thread is stuck, e.g. in a command that never returns) does the same.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use iptables::apply::{RunError, Runner};
use tokio::sync::Notify;

/// A heartbeat older than this means the apply thread is stuck (see the module docs).
pub const STALE_AFTER: Duration = Duration::from_secs(60);

/// The apply thread beats at least this often while it waits for work.
pub const TICK: Duration = Duration::from_secs(1);

/// Why the apply thread is not alive (the body of a 503 from `/liveness`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAlive {
    #[error("apply thread panicked: {0}")]
    Panicked(String),
    #[error("apply thread stopped")]
    Stopped,
    #[error("apply thread stuck: no heartbeat for {silent_ms} ms (bound {bound_ms} ms)")]
    Stale { silent_ms: u64, bound_ms: u64 },
}

/// The apply thread's heartbeat and, once it ended, why.
#[derive(Debug)]
pub struct Liveness {
    epoch: Instant,
    /// Milliseconds since `epoch` at the last beat.
    last_beat_ms: AtomicU64,
    stale_after: Duration,
    ended: Mutex<Option<NotAlive>>,
    /// Wakes [`Liveness::failure`] when the thread ends.
    ended_notify: Notify,
}

impl Liveness {
    /// A heartbeat that beats now; stale after `stale_after` without a beat.
    pub fn new(stale_after: Duration) -> Self {
        Liveness {
            epoch: Instant::now(),
            last_beat_ms: AtomicU64::new(0),
            stale_after,
            ended: Mutex::new(None),
            ended_notify: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The apply thread is making progress.
    pub fn beat(&self) {
        self.last_beat_ms
            .fetch_max(self.now_ms(), Ordering::Relaxed);
    }

    /// The apply thread ended (the first cause recorded wins).
    pub fn ended(&self, why: NotAlive) {
        self.ended.lock().expect("liveness lock").get_or_insert(why);
        self.ended_notify.notify_one();
    }

    /// `Ok` while the apply thread runs and beat within the bound.
    pub fn check(&self) -> Result<(), NotAlive> {
        if let Some(why) = self.ended.lock().expect("liveness lock").clone() {
            return Err(why);
        }
        let silent_ms = self
            .now_ms()
            .saturating_sub(self.last_beat_ms.load(Ordering::Relaxed));
        let bound_ms = u64::try_from(self.stale_after.as_millis()).unwrap_or(u64::MAX);
        if silent_ms > bound_ms {
            return Err(NotAlive::Stale {
                silent_ms,
                bound_ms,
            });
        }
        Ok(())
    }

    /// Resolves when the apply thread ends or its heartbeat goes stale.
    pub async fn failure(&self) -> NotAlive {
        loop {
            if let Err(why) = self.check() {
                return why;
            }
            tokio::select! {
                _ = self.ended_notify.notified() => {}
                _ = tokio::time::sleep(TICK) => {}
            }
        }
    }
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness::new(STALE_AFTER)
    }
}

/// A panic's message, for [`NotAlive::Panicked`].
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// A [`Runner`] that beats the apply thread's heartbeat before and after every command, so a
/// long apply made of many commands is not mistaken for a stuck one, while one command that never
/// returns is.
#[derive(Debug, Clone)]
pub struct BeatingRunner<R> {
    inner: R,
    liveness: std::sync::Arc<Liveness>,
}

impl<R> BeatingRunner<R> {
    pub fn new(inner: R, liveness: std::sync::Arc<Liveness>) -> Self {
        BeatingRunner { inner, liveness }
    }
}

impl<R: Runner> Runner for BeatingRunner<R> {
    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<std::process::Output, RunError> {
        self.liveness.beat();
        let out = self.inner.run(program, args, stdin);
        self.liveness.beat();
        out
    }

    fn netns(&self) -> Option<&str> {
        self.inner.netns()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_beating_thread_is_alive_and_a_silent_one_goes_stale() {
        let l = Liveness::new(Duration::from_millis(50));
        assert_eq!(l.check(), Ok(()));
        std::thread::sleep(Duration::from_millis(80));
        let err = l.check().unwrap_err();
        assert!(matches!(err, NotAlive::Stale { bound_ms: 50, .. }), "{err}");
        assert!(err.to_string().starts_with("apply thread stuck"), "{err}");
        l.beat();
        assert_eq!(l.check(), Ok(()));
    }

    #[test]
    fn an_ended_thread_stays_dead_with_its_first_cause() {
        let l = Liveness::default();
        l.ended(NotAlive::Panicked("boom".into()));
        l.ended(NotAlive::Stopped);
        l.beat();
        assert_eq!(l.check(), Err(NotAlive::Panicked("boom".into())));
        assert_eq!(
            l.check().unwrap_err().to_string(),
            "apply thread panicked: boom"
        );
    }

    #[tokio::test]
    async fn failure_resolves_when_the_thread_ends() {
        let l = std::sync::Arc::new(Liveness::default());
        let l2 = l.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            l2.ended(NotAlive::Stopped);
        });
        let why = tokio::time::timeout(Duration::from_secs(5), l.failure())
            .await
            .expect("failure noticed");
        assert_eq!(why, NotAlive::Stopped);
    }
}
