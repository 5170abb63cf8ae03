//! [`Backoff`]: exponential backoff with jitter, sans-IO.
//!
//! Without jitter, every client that lost the same master at the same
//! instant retries at the same instants: after a failover, 1 000 agents
//! re-register (and re-send their status update heads) in lockstep.
//! Jitter spreads them: each delay is its step of the doubling sequence
//! (`min`, `2·min`, … capped at `max`) shortened by up to `jitter` of
//! itself, so a delay is never longer than its step and never longer
//! than `max`, and the cap is spread too.

use std::time::Duration;

/// The jitter used unless a caller says otherwise: each delay is between
/// half its step and all of it.
pub const DEFAULT_JITTER: f64 = 0.5;

/// Exponential backoff with jitter. The randomness is an input
/// ([`Backoff::next_delay`] takes a sample in `[0, 1)`), so sans-IO cores
/// stay deterministic and tests can choose it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    jitter: f64,
    step: Duration,
}

/// A uniform sample in `[0, 1)` for [`Backoff::next_delay`], from the
/// thread's random generator (for IO shells; cores take theirs from
/// their caller).
pub fn random_sample() -> f64 {
    rand::random::<f64>()
}

// === impl Backoff ===

impl Backoff {
    /// Steps from `min` (at least 1 ms) doubling up to `max` (at least
    /// `min`); `jitter` in `[0, 1]` (0: none; clamped) is how much of a
    /// step may be taken off.
    pub fn new(min: Duration, max: Duration, jitter: f64) -> Backoff {
        let min = min.max(Duration::from_millis(1));
        let jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        Backoff {
            min,
            max: max.max(min),
            jitter,
            step: min,
        }
    }

    /// The first step.
    pub fn min(&self) -> Duration {
        self.min
    }

    /// The cap.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The next delay's step, before jitter.
    pub fn step(&self) -> Duration {
        self.step
    }

    /// The next delay: the current step less up to `jitter` of it, as
    /// `sample` (in `[0, 1)`; clamped) says; the step then doubles, up to
    /// the cap.
    pub fn next_delay(&mut self, sample: f64) -> Duration {
        let sample = if sample.is_finite() {
            sample.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let step = self.step;
        self.step = step.saturating_mul(2).min(self.max);
        step.mul_f64(1.0 - self.jitter * sample)
    }

    /// Back to the first step (after a success).
    pub fn reset(&mut self) {
        self.step = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn without_jitter_steps_double_to_the_cap() {
        let mut b = Backoff::new(100 * MS, 350 * MS, 0.0);
        let delays: Vec<_> = (0..5).map(|_| b.next_delay(0.9).as_millis()).collect();
        assert_eq!(delays, vec![100, 200, 350, 350, 350]);
        b.reset();
        assert_eq!(b.next_delay(0.5), 100 * MS);
    }

    #[test]
    fn jitter_takes_off_up_to_its_share_of_each_step() {
        let mut low = Backoff::new(100 * MS, 1000 * MS, 0.5);
        let mut high = low;
        // The sample decides: 0 keeps the whole step, nearly 1 halves it.
        let lows: Vec<_> = (0..5).map(|_| low.next_delay(0.0).as_millis()).collect();
        let highs: Vec<_> = (0..5)
            .map(|_| high.next_delay(0.999_999).as_millis())
            .collect();
        assert_eq!(lows, vec![100, 200, 400, 800, 1000]);
        assert_eq!(highs, vec![50, 100, 200, 400, 500]);
        // At the cap as well as below it, delays stay in [step/2, step].
        let mut b = Backoff::new(100 * MS, 1000 * MS, 0.5);
        for i in 0..50 {
            let sample = (i as f64 * 0.137) % 1.0;
            let step = b.step();
            let d = b.next_delay(sample);
            assert!(d <= step && d >= step / 2, "{d:?} for step {step:?}");
            assert!(d <= b.max());
        }
    }

    #[test]
    fn many_clients_with_their_own_samples_spread_out() {
        // 1 000 clients that lost a master at the same instant: without
        // jitter they all retry at 100 ms; with it, over 50..100 ms.
        let samples = (0..1000).map(|i| i as f64 / 1000.0);
        let mut at: Vec<Duration> = samples
            .map(|s| Backoff::new(100 * MS, 5000 * MS, DEFAULT_JITTER).next_delay(s))
            .collect();
        at.sort();
        at.dedup();
        assert!(at.len() > 400, "only {} distinct retry times", at.len());
        assert!(at[0] >= 50 * MS && *at.last().unwrap() <= 100 * MS);
    }

    #[test]
    fn odd_inputs_are_tamed() {
        let mut b = Backoff::new(Duration::ZERO, Duration::ZERO, f64::NAN);
        assert_eq!(b.min(), MS);
        assert_eq!(b.max(), MS);
        assert_eq!(b.next_delay(f64::INFINITY), MS);
        let mut b = Backoff::new(10 * MS, 20 * MS, 7.0);
        assert_eq!(b.next_delay(2.0), Duration::ZERO);
        assert_eq!(b.next_delay(-1.0), 20 * MS);
    }

    #[test]
    fn random_samples_are_in_range() {
        for _ in 0..1000 {
            let s = random_sample();
            assert!((0.0..1.0).contains(&s));
        }
    }
}
