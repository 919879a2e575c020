//! The client's adaptive send rate: after the server throttles (a `429`, a `503` with `Retry-After`),
//! the client lowers the rate at which it sends attempts, first attempts included, and raises it
//! again as answers come back without throttles. The same CUBIC rule as the AWS SDKs' `adaptive`
//! retry mode (ADR 0054): on a throttle the rate falls to 0.7 of what the client was sending, then
//! it grows as a cubic of the time since, flat near the rate that was throttled and fast away from
//! it, never above twice the measured send rate. Two departures from AWS's rule, both for a
//! client whose clones send many calls at once: the rate is cut at most once per half second (the
//! throttles of one burst are one signal, as TCP cuts once per round trip; AWS cuts on each, so a
//! burst of a thousand throttles drives the rate to its floor), and before a half second has
//! been measured the send rate is what was answered so far in it, not zero. And once the rate has
//! climbed back to the one that was throttled with no throttle since, the limiter steps aside
//! until the next throttle (AWS keeps it on for good, capped at twice the measured rate, which
//! holds a client that sends in bursts to the average of its idle gaps).
//!
//! One limiter per `Client`, shared by its clones. It measures time on tokio's clock (so a paused
//! clock drives it exactly) and knows nothing of HTTP, of the budget or of the attempt loop, which
//! asks it for a wait before each attempt and tells it of each answer.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The share of the measured rate kept after a throttle (CUBIC's β).
const BETA: f64 = 0.7;
/// How fast the rate grows back (CUBIC's C).
const SCALE: f64 = 0.4;
/// The weight of the newest half-second in the measured send rate.
const SMOOTH: f64 = 0.8;
/// The least rate ever allowed, in attempts per second: a throttled client still probes.
const MIN_FILL_RATE: f64 = 0.5;
/// The least burst the bucket holds.
const MIN_CAPACITY: f64 = 1.0;
/// The measurement's bucket, and the least time between two cuts of the rate, in seconds.
const BUCKET: f64 = 0.5;

/// The running limiter.
#[derive(Debug)]
pub(crate) struct AdaptiveRate {
    epoch: Instant,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Off until the first throttle: until then attempts are never delayed.
    enabled: bool,
    /// Attempts allowed per second.
    fill_rate: f64,
    max_capacity: f64,
    /// Tokens in the bucket; below zero when attempts have reserved sends not yet due.
    capacity: f64,
    last_refill: Option<f64>,
    /// The client's own send rate, smoothed over half-second buckets.
    measured: f64,
    last_bucket: f64,
    count: u64,
    /// The rate in force at the last throttle, and when that was.
    last_max_rate: f64,
    last_throttle: f64,
    time_window: f64,
}

impl Default for AdaptiveRate {
    fn default() -> Self {
        Self::new()
    }
}

impl AdaptiveRate {
    pub(crate) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            state: Mutex::new(State {
                enabled: false,
                fill_rate: 0.0,
                max_capacity: 0.0,
                capacity: 0.0,
                last_refill: None,
                measured: 0.0,
                last_bucket: 0.0,
                count: 0,
                last_max_rate: 0.0,
                last_throttle: 0.0,
                time_window: 0.0,
            }),
        }
    }

    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update leaves the state whole: a panic elsewhere cannot tear it.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Reserves one send and returns how long to wait before making it: zero until the server has
    /// throttled, and while the bucket has a token. Reservations queue: each waits its turn at the
    /// rate in force when it was made. A reservation not used must be [`release`](Self::release)d.
    pub(crate) fn acquire(&self) -> Duration {
        let now = self.now();
        let mut s = self.state();
        if !s.enabled {
            return Duration::ZERO;
        }
        s.refill(now);
        s.capacity -= 1.0;
        if s.capacity >= 0.0 {
            return Duration::ZERO;
        }
        Duration::try_from_secs_f64(-s.capacity / s.fill_rate).unwrap_or(Duration::MAX)
    }

    /// Gives back a send reserved and not made (its call was cancelled while it waited, or it
    /// would have been sent past the call's `max_elapsed`).
    pub(crate) fn release(&self) {
        let mut s = self.state();
        if s.enabled {
            s.capacity = (s.capacity + 1.0).min(s.max_capacity);
        }
    }

    /// Takes an attempt's answer: `throttled` when the server shed it (see `cost::Cause`).
    pub(crate) fn observe(&self, throttled: bool) {
        let now = self.now();
        let mut s = self.state();
        s.measure(now);
        let calculated = if throttled {
            if s.enabled && now - s.last_throttle < BUCKET {
                // The same burst's throttles: the rate was cut for it already.
                return;
            }
            if s.measured < f64::EPSILON {
                // Nothing measured yet: what was answered in the bucket so far.
                #[allow(
                    clippy::cast_precision_loss,
                    reason = "a count of answers in half a second is far below 2^52"
                )]
                let so_far = s.count as f64 / BUCKET;
                s.measured = so_far;
            }
            let rate = if s.enabled {
                s.measured.min(s.fill_rate)
            } else {
                s.measured
            };
            s.last_max_rate = rate;
            s.time_window = s.window();
            s.last_throttle = now;
            s.enabled = true;
            rate * BETA
        } else {
            if !s.enabled {
                return;
            }
            s.time_window = s.window();
            if now - s.last_throttle >= s.time_window {
                // Climbed back to the rate that was throttled with no throttle since: the
                // limiter steps aside until the next one. Kept on, its cap of twice the measured
                // rate would hold a client that sends in bursts to what its idle gaps averaged.
                s.enabled = false;
                return;
            }
            SCALE * (now - s.last_throttle - s.time_window).powi(3) + s.last_max_rate
        };
        let rate = calculated.min(2.0 * s.measured);
        s.refill(now);
        s.fill_rate = rate.max(MIN_FILL_RATE);
        s.max_capacity = rate.max(MIN_CAPACITY);
        s.capacity = s.capacity.min(s.max_capacity);
    }

    /// The attempts per second the client allows itself now, or `None` before any throttle.
    pub(crate) fn send_rate(&self) -> Option<f64> {
        let s = self.state();
        s.enabled.then_some(s.fill_rate)
    }
}

impl State {
    fn refill(&mut self, now: f64) {
        if let Some(last) = self.last_refill {
            let filled = (now - last) * self.fill_rate;
            self.capacity = (self.capacity + filled).min(self.max_capacity);
        }
        self.last_refill = Some(now);
    }

    /// The time the cubic takes to climb back to the rate that was throttled.
    fn window(&self) -> f64 {
        (self.last_max_rate * (1.0 - BETA) / SCALE).cbrt()
    }

    /// Counts one answer in the client's measured send rate.
    fn measure(&mut self, now: f64) {
        let bucket = (now / BUCKET).floor() * BUCKET;
        self.count += 1;
        if bucket > self.last_bucket {
            // Answers counted since the last bucket: a rate over the buckets between.
            #[allow(
                clippy::cast_precision_loss,
                reason = "a count of answers in half a second is far below 2^52"
            )]
            let current = self.count as f64 / (bucket - self.last_bucket);
            self.measured = current * SMOOTH + self.measured * (1.0 - SMOOTH);
            self.count = 0;
            self.last_bucket = bucket;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// Sends `per_second` attempts a second for `secs` seconds, each answered at once.
    async fn traffic(rate: &AdaptiveRate, per_second: u32, secs: u32, throttled: bool) {
        let gap = Duration::from_secs(1) / per_second;
        for _ in 0..per_second * secs {
            tokio::time::sleep(rate.acquire()).await;
            rate.observe(throttled);
            tokio::time::sleep(gap).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn never_delays_before_a_throttle() {
        let rate = AdaptiveRate::new();
        traffic(&rate, 100, 2, false).await;
        assert_eq!(rate.send_rate(), None);
        for _ in 0..1_000 {
            assert_eq!(rate.acquire(), Duration::ZERO);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttle_cuts_the_rate_to_beta_of_the_measured_one_and_success_raises_it() {
        let rate = AdaptiveRate::new();
        traffic(&rate, 100, 3, false).await;
        rate.observe(true);
        let cut = rate.send_rate().unwrap();
        // ~100/s measured, times 0.7.
        assert!((60.0..=75.0).contains(&cut), "{cut}");
        // Back-to-back sends now wait their turn at that rate.
        let waits: Vec<_> = (0..200).map(|_| rate.acquire()).collect();
        let last = *waits.last().unwrap();
        assert!(
            last >= ms(2_000) && last <= ms(3_500),
            "200 sends at ~{cut}/s: {last:?}"
        );
        for _ in 0..200 {
            rate.release();
        }
        // Answers without throttles raise it again, past where it was cut.
        tokio::time::sleep(ms(500)).await;
        traffic(&rate, 60, 2, false).await;
        let risen = rate.send_rate().unwrap();
        assert!(risen > cut, "{risen} after {cut}");
        // Back at the rate that was throttled, with no throttle since, it steps aside: a burst
        // after an idle gap is not held to what the gap averaged.
        traffic(&rate, 60, 3, false).await;
        assert_eq!(rate.send_rate(), None);
        tokio::time::sleep(Duration::from_secs(60)).await;
        for _ in 0..1_000 {
            assert_eq!(rate.acquire(), Duration::ZERO);
        }
        // The next throttle turns it on again.
        traffic(&rate, 100, 1, false).await;
        rate.observe(true);
        assert!(rate.send_rate().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn repeated_throttles_drive_it_to_the_floor_and_no_further() {
        let rate = AdaptiveRate::new();
        traffic(&rate, 50, 1, false).await;
        for _ in 0..60 {
            tokio::time::sleep(rate.acquire()).await;
            rate.observe(true);
            tokio::time::sleep(ms(500)).await;
        }
        assert_eq!(rate.send_rate(), Some(MIN_FILL_RATE));
        // At half an attempt a second, the next send waits up to two seconds.
        assert!(rate.acquire() <= ms(2_000));
    }

    #[tokio::test(start_paused = true)]
    async fn the_same_traffic_gives_the_same_rate() {
        let run = || async {
            let rate = AdaptiveRate::new();
            traffic(&rate, 40, 2, false).await;
            traffic(&rate, 40, 1, true).await;
            let cut = rate.send_rate();
            traffic(&rate, 40, 1, false).await;
            (cut, rate.send_rate())
        };
        let first = run().await;
        assert!(first.0.is_some());
        assert_eq!(first, run().await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_throttles_cuts_the_rate_once() {
        let rate = AdaptiveRate::new();
        traffic(&rate, 100, 3, false).await;
        rate.observe(true);
        let cut = rate.send_rate().unwrap();
        for _ in 0..500 {
            rate.observe(true);
        }
        assert_eq!(rate.send_rate(), Some(cut));
        tokio::time::sleep(ms(500)).await;
        rate.observe(true);
        assert!(
            rate.send_rate().unwrap() < cut,
            "cut again half a second later"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttle_before_anything_was_measured_counts_the_answers_so_far() {
        let rate = AdaptiveRate::new();
        for _ in 0..200 {
            rate.observe(false);
        }
        rate.observe(true);
        // 201 answers in the first half second: 402 a second, times 0.7.
        let cut = rate.send_rate().unwrap();
        assert!((cut - 281.4).abs() < 1e-9, "{cut}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_reservation_is_given_back() {
        let rate = AdaptiveRate::new();
        traffic(&rate, 10, 2, false).await;
        rate.observe(true);
        let first = rate.acquire();
        let second = rate.acquire();
        assert!(second > first);
        rate.release();
        assert_eq!(rate.acquire(), second, "the released turn is taken again");
    }
}
