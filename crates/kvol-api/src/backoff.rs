//! Exponential backoff between attempts: the one policy every retry loop of kvol uses (operations, registration, dialling, supervised drivers).

use std::time::Duration;

/// Waits between attempts: `initial` after the first failure, doubling, at most `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    /// 500 ms doubling to 30 s: plugin registration's retries.
    fn default() -> Self {
        Backoff { initial: Duration::from_millis(500), max: Duration::from_secs(30) }
    }
}

impl Backoff {
    /// Volume operations, as kubelet retries them: 500 ms doubling to 2m2s (upstream's
    /// `initialDurationBeforeRetry` and `maxDurationBeforeRetry`).
    pub const OPERATIONS: Backoff =
        Backoff { initial: Duration::from_millis(500), max: Duration::from_secs(122) };

    /// The wait after the `failures`-th failure in a row (none before the first). Never below
    /// 1 ms, so that a zero configuration cannot make a retry loop spin.
    pub fn delay(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let factor = 2u32.checked_pow(failures - 1).unwrap_or(u32::MAX);
        self.initial.checked_mul(factor).unwrap_or(self.max).min(self.max).max(Duration::from_millis(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap() {
        let b = Backoff::default();
        let cases = [
            (0, 0),
            (1, 500),
            (2, 1_000),
            (3, 2_000),
            (6, 16_000),
            (7, 30_000),
            (8, 30_000),
            (40, 30_000),
            (u32::MAX, 30_000),
        ];
        for (failures, ms) in cases {
            assert_eq!(b.delay(failures), Duration::from_millis(ms), "after {failures} failures");
        }
        let zero = Backoff { initial: Duration::ZERO, max: Duration::ZERO };
        assert_eq!(zero.delay(3), Duration::from_millis(1));
        let capped_below = Backoff { initial: Duration::from_secs(5), max: Duration::from_secs(2) };
        assert_eq!(capped_below.delay(1), Duration::from_secs(2));
    }

    #[test]
    fn operations_back_off_as_kubelet_does() {
        let rows = [(1, 500), (2, 1_000), (3, 2_000), (4, 4_000), (8, 64_000), (9, 122_000), (40, 122_000)];
        for (failures, ms) in rows {
            assert_eq!(Backoff::OPERATIONS.delay(failures), Duration::from_millis(ms), "{failures} failures");
        }
    }
}
