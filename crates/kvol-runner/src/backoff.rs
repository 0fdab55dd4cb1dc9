//! Kubelet's restart back-off (client-go's flowcontrol.Backoff as kubelet sets it up): 10 s, doubling to 5 min, forgotten once nothing happened for twice the maximum (10 min); pure, with the clock passed in.

use std::collections::HashMap;
use std::time::Duration;

pub const INITIAL: Duration = Duration::from_secs(10);
pub const MAX: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    backoff: Duration,
    last_update: Duration,
}

/// Back-off per key (a container: pod uid, name and spec hash; an image pull: pod uid and
/// image). Times are durations since the Unix epoch, as CRI reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Backoff {
    entries: HashMap<String, Entry>,
}

impl Backoff {
    /// Whether `key` must still wait after something that happened at `event` (a container's
    /// finish): the time left, or `None` when it may go now.
    pub fn waiting(&self, key: &str, event: Duration, now: Duration) -> Option<Duration> {
        let entry = self.entries.get(key)?;
        if expired(event, entry.last_update) {
            return None;
        }
        let since = now.saturating_sub(event);
        (since < entry.backoff).then(|| entry.backoff - since)
    }

    /// Whether `key` must still wait after its last [`Backoff::next`] (kubelet's image pull
    /// back-off, `IsInBackOffSinceUpdate`): the time left, or `None`.
    pub fn waiting_since_update(&self, key: &str, now: Duration) -> Option<Duration> {
        let entry = self.entries.get(key)?;
        let since = now.saturating_sub(entry.last_update);
        (since < entry.backoff).then(|| entry.backoff - since)
    }

    /// `key` goes now: its next wait doubles (up to [`MAX`]), or starts again at [`INITIAL`]
    /// when it was forgotten.
    pub fn next(&mut self, key: &str, event: Duration, now: Duration) {
        let backoff = match self.entries.get(key) {
            Some(entry) if !expired(event, entry.last_update) => (entry.backoff * 2).min(MAX),
            _ => INITIAL,
        };
        self.entries.insert(key.to_string(), Entry { backoff, last_update: now });
    }

    /// The wait `key` has now (what kubelet's message says).
    pub fn current(&self, key: &str) -> Duration {
        self.entries.get(key).map(|e| e.backoff).unwrap_or(INITIAL)
    }

    /// Forgets the keys `keep` says no to (pods gone).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.entries.retain(|k, _| keep(k));
    }
}

fn expired(event: Duration, last_update: Duration) -> bool {
    event.saturating_sub(last_update) > 2 * MAX
}

/// Go's `time.Duration` text for whole seconds and minutes (`10s`, `2m40s`, `5m0s`).
pub fn go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 60 { format!("{secs}s") } else { format!("{}m{}s", secs / 60, secs % 60) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// A container crashing right after each start: the waits kubelet makes.
    #[test]
    fn crash_loop_waits() {
        let mut b = Backoff::default();
        let mut now = S(1000);
        let mut waits = Vec::new();
        for _ in 0..8 {
            // It exits at once; the runner looks until it may go.
            let finished = now;
            let wait = b.waiting("k", finished, now).unwrap_or_default();
            waits.push(wait.as_secs());
            now += wait;
            assert_eq!(b.waiting("k", finished, now), None);
            b.next("k", finished, now);
        }
        assert_eq!(waits, vec![0, 10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn forgotten_after_ten_quiet_minutes() {
        // (case, last update, event, expected wait at the event)
        let cases = [
            ("within ten minutes the wait doubles", S(1000), S(1000 + 600), Some(S(20))),
            ("past ten minutes it is forgotten", S(1000), S(1000 + 601), None),
        ];
        for (name, update, event, want) in cases {
            let mut b = Backoff::default();
            b.next("k", update, update);
            b.next("k", update, update);
            assert_eq!(b.current("k"), S(20), "{name}");
            assert_eq!(b.waiting("k", event, event), want, "{name}");
        }
        let mut b = Backoff::default();
        b.next("k", S(0), S(0));
        b.next("k", S(0), S(0));
        b.next("k", S(700), S(700));
        assert_eq!(b.current("k"), INITIAL, "a next after the quiet time starts over");
    }

    #[test]
    fn pull_waits_count_from_the_last_failure() {
        let mut b = Backoff::default();
        assert_eq!(b.waiting_since_update("img", S(100)), None, "never failed");
        b.next("img", S(100), S(100));
        // (case, now, expected)
        let cases =
            [("at once", S(100), Some(S(10))), ("4 s on", S(104), Some(S(6))), ("10 s on", S(110), None)];
        for (name, now, want) in cases {
            assert_eq!(b.waiting_since_update("img", now), want, "{name}");
        }
        b.next("img", S(110), S(110));
        assert_eq!(b.waiting_since_update("img", S(125)), Some(S(5)), "the second wait is 20 s");
    }

    #[test]
    fn go_durations() {
        for (secs, text) in [(10, "10s"), (160, "2m40s"), (300, "5m0s")] {
            assert_eq!(go_duration(S(secs)), text);
        }
    }
}
