//! At most one log line per key (a driver directory) per period, with how many were held back: a driver directory churning thousands of times a second logs a summary, not every event.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often one driver directory may log: as often as it may be probed.
pub const LOG_PERIOD: Duration = Duration::from_secs(1);

/// Per key, when it last logged and how many lines it held back since.
#[derive(Debug, Default)]
pub struct LogGate {
    last: Mutex<HashMap<String, (Instant, u64)>>,
}

impl LogGate {
    /// Whether `key` may log now: `Some(held_back)` (the lines held back since its last one),
    /// or `None` (hold this one back).
    pub fn pass(&self, key: &str) -> Option<u64> {
        self.pass_at(key, Instant::now())
    }

    /// [`LogGate::pass`] at `now`.
    pub fn pass_at(&self, key: &str, now: Instant) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        // Keys idle for a period go, so the map holds only the directories churning now.
        if last.len() > 1024 {
            last.retain(|_, (at, held)| now.duration_since(*at) < LOG_PERIOD || *held > 0);
        }
        match last.get_mut(key) {
            Some((at, held)) if now.duration_since(*at) < LOG_PERIOD => {
                *held += 1;
                None
            }
            Some((at, held)) => {
                let passed = *held;
                (*at, *held) = (now, 0);
                Some(passed)
            }
            None => {
                last.insert(key.to_string(), (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_key_per_period_with_the_count_held_back() {
        let gate = LogGate::default();
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // (key, at ms, passes with this many held back)
        let rows: &[(&str, u64, Option<u64>)] = &[
            ("a~d", 0, Some(0)),
            ("a~d", 10, None),
            ("a~d", 999, None),
            ("b~d", 500, Some(0)),
            ("a~d", 1000, Some(2)),
            ("a~d", 1500, None),
            ("a~d", 5000, Some(1)),
            ("b~d", 5000, Some(0)),
        ];
        for (key, at, want) in rows {
            assert_eq!(gate.pass_at(key, ms(*at)), *want, "{key} at {at} ms");
        }
    }
}
