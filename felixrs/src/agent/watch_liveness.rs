//! When is an etcd connection dead? The decision behind the syncer's watch liveness (see the
//! `syncer` module doc), kept apart from the I/O so it can be tested with tokio's paused clock.
//!
//! The evidence is what the connection says, measured against the time the agent was actually
//! running:
//! * After a quiet `window` (nothing heard), the connection is *checked* (a progress request, or a
//!   one-key read behind a proxy that ignores progress requests), and the check has `window` to be
//!   answered, counted from when it was sent, not from when it was due.
//! * Anything heard (an event, a progress answer, a read's answer) ends the silence.
//! * The connection is dead only after **two consecutive** unanswered checks, so it is noticed
//!   within `3 × window` of its last word (15 s with the default 10 s `liveness_timeout`).
//! * A check cannot time out for time the process spent not running: a deadline whose timer
//!   fires [`LATE`] or more after it was due (the task ran late: the process was starved of CPU,
//!   or stopped) is moved by that lateness, up to one more `window` per check; so a starved agent
//!   notices a dead connection within `5 × window` at most (25 s). A real node starved of CPU, or
//!   5,000 syncers in one process (the fan-out bench), otherwise takes its own backlog for a dead
//!   connection, and the reconnects feed the load.
//!
//! [`timeout_running`] applies the same rule to a single request (etcd's request timeout).

use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};

/// A timer that fires this much after its deadline or more tells that the task was not running
/// (at a few milliseconds the runtime is merely busy). Smaller lateness is not credited, which
/// also bounds how often a deadline can be moved.
pub const LATE: Duration = Duration::from_millis(100);

/// Consecutive unanswered checks that make a connection dead.
const DEAD_AFTER: u32 = 2;

/// What the syncer does when the liveness deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The deadline moved (the timer fired late: that time is credited); wait for the new one.
    Wait,
    /// Check the connection now (ask it something); its answer is due a window from now.
    Check,
    /// Two checks in a row went unanswered: the connection is dead, silent this long.
    Dead(Duration),
}

/// The liveness state of one watch's connection.
#[derive(Debug, Clone)]
pub struct Liveness {
    window: Duration,
    /// When the connection last said something.
    heard_at: Instant,
    /// When the current window ends.
    deadline: Instant,
    /// Whether the current window is a check (something was asked) rather than the quiet
    /// window after the last answer.
    checking: bool,
    /// Checks in a row that went unanswered.
    unanswered: u32,
    /// Lateness credited to the current check (at most `window`).
    credited: Duration,
}

impl Liveness {
    /// A connection just opened at `now` (its first quiet window starts).
    pub fn new(window: Duration, now: Instant) -> Self {
        Self {
            window,
            heard_at: now,
            deadline: now + window,
            checking: false,
            unanswered: 0,
            credited: Duration::ZERO,
        }
    }

    /// The longest silence after which a dead connection is noticed while the process runs:
    /// the quiet window and two unanswered checks.
    pub fn bound(window: Duration) -> Duration {
        window * (1 + DEAD_AFTER)
    }

    /// The connection said something at `now`: the silence ends, a new quiet window starts.
    pub fn heard(&mut self, now: Instant) {
        self.heard_at = now;
        self.deadline = now + self.window;
        self.checking = false;
        self.unanswered = 0;
        self.credited = Duration::ZERO;
    }

    /// When [`Liveness::expired`] is next due.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether a check is outstanding (the connection was asked and has not answered).
    pub fn checking(&self) -> bool {
        self.checking
    }

    /// The deadline's timer fired at `now`.
    pub fn expired(&mut self, now: Instant) -> Verdict {
        if now < self.deadline {
            return Verdict::Wait;
        }
        if self.checking {
            let late = now - self.deadline;
            let credit = late.min(self.window.saturating_sub(self.credited));
            if late >= LATE && !credit.is_zero() {
                // The check had `late` less time to be answered than it was given, while this
                // task was not running (nor, likely, the connection's): give it back.
                self.credited += credit;
                self.deadline = now + credit;
                return Verdict::Wait;
            }
            self.unanswered += 1;
            if self.unanswered >= DEAD_AFTER {
                return Verdict::Dead(now - self.heard_at);
            }
        }
        // A check is sent now; its window counts from now (a quiet window that ended late just
        // sends its check late).
        self.checking = true;
        self.credited = Duration::ZERO;
        self.deadline = now + self.window;
        Verdict::Check
    }
}

/// `fut`, or `Err(())` when it took `limit` of the time this task was running: like
/// `tokio::time::timeout`, but a timer that fires [`LATE`] or more after its deadline moves the
/// deadline by that lateness (up to `limit` more in all), so a request does not time out because
/// the process was starved while the answer was on its way.
pub async fn timeout_running<F: Future>(limit: Duration, fut: F) -> Result<F::Output, ()> {
    tokio::pin!(fut);
    let mut deadline = Instant::now() + limit;
    let mut credited = Duration::ZERO;
    loop {
        tokio::select! {
            biased;
            out = &mut fut => return Ok(out),
            _ = sleep_until(deadline) => {
                let now = Instant::now();
                let late = now - deadline;
                let credit = late.min(limit.saturating_sub(credited));
                if late < LATE || credit.is_zero() {
                    return Err(());
                }
                credited += credit;
                deadline = now + credit;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::advance;

    const W: Duration = Duration::from_secs(5);

    /// Steps the paused clock to `late` after the deadline (when the timer fires) and asks the
    /// verdict.
    async fn fire(l: &mut Liveness, late: Duration) -> Verdict {
        advance(l.deadline() + late - Instant::now()).await;
        l.expired(Instant::now())
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_dead_after_two_unanswered_checks_not_one() {
        let t0 = Instant::now();
        let mut l = Liveness::new(W, t0);
        assert_eq!(fire(&mut l, Duration::ZERO).await, Verdict::Check);
        assert_eq!(
            l.deadline(),
            t0 + 2 * W,
            "the check has a window from when it was sent"
        );
        // One unanswered check: check again, not dead.
        assert_eq!(fire(&mut l, Duration::ZERO).await, Verdict::Check);
        // The second unanswered check: dead, silent for the bound.
        assert_eq!(
            fire(&mut l, Duration::ZERO).await,
            Verdict::Dead(Liveness::bound(W))
        );
        assert_eq!(Liveness::bound(W), Duration::from_secs(15));
    }

    #[tokio::test(start_paused = true)]
    async fn anything_heard_ends_the_silence_and_the_unanswered_count() {
        let t0 = Instant::now();
        let mut l = Liveness::new(W, t0);
        assert_eq!(fire(&mut l, Duration::ZERO).await, Verdict::Check);
        assert_eq!(fire(&mut l, Duration::ZERO).await, Verdict::Check);
        // The answer to the first check, late: alive; counting starts over.
        advance(Duration::from_secs(1)).await;
        l.heard(Instant::now());
        assert!(!l.checking());
        assert_eq!(fire(&mut l, Duration::ZERO).await, Verdict::Check);
        assert_eq!(fire(&mut l, Duration::ZERO).await, Verdict::Check);
        assert!(matches!(
            fire(&mut l, Duration::ZERO).await,
            Verdict::Dead(_)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_whose_timer_fired_late_does_not_count_as_unanswered() {
        let t0 = Instant::now();
        let mut l = Liveness::new(W, t0);
        assert_eq!(fire(&mut l, Duration::ZERO).await, Verdict::Check);
        assert_eq!(fire(&mut l, Duration::ZERO).await, Verdict::Check);
        // The second check's timer fires 3 s late (the process did not run): not dead, the
        // deadline moves by the 3 s.
        let due = l.deadline();
        assert_eq!(fire(&mut l, Duration::from_secs(3)).await, Verdict::Wait);
        assert_eq!(l.deadline(), due + Duration::from_secs(6));
        // Its answer arrives within the credited time: alive.
        advance(Duration::from_secs(2)).await;
        l.heard(Instant::now());
        assert!(!l.checking());
        // A timer merely a few milliseconds late is no starvation: it counts.
        assert_eq!(fire(&mut l, Duration::ZERO).await, Verdict::Check);
        assert_eq!(fire(&mut l, Duration::from_millis(5)).await, Verdict::Check);
    }

    #[tokio::test(start_paused = true)]
    async fn lateness_is_credited_at_most_one_window_per_check() {
        let t0 = Instant::now();
        let mut l = Liveness::new(W, t0);
        assert_eq!(fire(&mut l, Duration::ZERO).await, Verdict::Check);
        // Each time the timer fires 4 s late (a process starved all along): the check gets
        // 5 s of credit in all, then counts; so does the next; then the connection is dead.
        let mut verdicts = Vec::new();
        loop {
            let v = fire(&mut l, Duration::from_secs(4)).await;
            verdicts.push(v);
            if matches!(v, Verdict::Dead(_)) {
                break;
            }
            assert!(verdicts.len() < 10, "never dead: {verdicts:?}");
        }
        use Verdict::*;
        assert_eq!(verdicts[..3], [Wait, Wait, Check], "{verdicts:?}");
        assert_eq!(verdicts[3..5], [Wait, Wait], "{verdicts:?}");
        assert!(matches!(verdicts[5], Dead(_)), "{verdicts:?}");
        assert_eq!(verdicts.len(), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_window_that_ended_late_sends_its_check_from_then() {
        let t0 = Instant::now();
        let mut l = Liveness::new(W, t0);
        let late = t0 + W + Duration::from_secs(7);
        assert_eq!(fire(&mut l, Duration::from_secs(7)).await, Verdict::Check);
        assert_eq!(l.deadline(), late + W);
    }

    #[tokio::test(start_paused = true)]
    async fn timeout_running_times_out_on_time_and_forgives_a_late_timer() {
        // On time: the limit.
        let t0 = Instant::now();
        let never = std::future::pending::<()>();
        assert_eq!(timeout_running(W, never).await, Err(()));
        assert_eq!(Instant::now() - t0, W);
        // Answered in time.
        let quick = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            7
        };
        assert_eq!(timeout_running(W, quick).await, Ok(7));
        // The request's answer is 12 s away. Waited for on time, it times out at 5 s.
        let slow = || tokio::time::sleep(Duration::from_secs(12));
        assert_eq!(timeout_running(W, slow()).await, Err(()));
        // The task is not running (a starved process) from before its 5 s deadline until 9 s,
        // so its timer is seen 4 s late: the 4 s are credited (deadline 13 s), and the answer
        // at 12 s is taken.
        let t = tokio::spawn(timeout_running(W, slow()));
        tokio::task::yield_now().await;
        advance(Duration::from_secs(9)).await;
        assert_eq!(t.await.unwrap(), Ok(()));
    }
}
