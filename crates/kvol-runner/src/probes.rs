//! Startup, liveness and readiness probes as kubelet's prober workers keep them: each probe's timing (initialDelaySeconds, periodSeconds, timeoutSeconds, thresholds, with the API's defaults) and its result, which changes only after enough equal results in a row; pure, with the clock passed in.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};

/// Which probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Startup,
    Liveness,
    Readiness,
}

impl Kind {
    pub fn of(self, container: &Container) -> Option<&Probe> {
        match self {
            Kind::Startup => container.startup_probe.as_ref(),
            Kind::Liveness => container.liveness_probe.as_ref(),
            Kind::Readiness => container.readiness_probe.as_ref(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Startup => "startup",
            Kind::Liveness => "liveness",
            Kind::Readiness => "readiness",
        }
    }
}

/// A probe's timing with the API server's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

fn seconds(value: Option<i32>, default: i32, least: i32) -> Duration {
    Duration::from_secs(value.unwrap_or(default).max(least) as u64)
}

/// Timing of `probe` (liveness and startup need one success, whatever is written).
pub fn timing(probe: &Probe, kind: Kind) -> Timing {
    let success =
        if kind == Kind::Readiness { probe.success_threshold.unwrap_or(1).max(1) as u32 } else { 1 };
    Timing {
        initial_delay: seconds(probe.initial_delay_seconds, 0, 0),
        period: seconds(probe.period_seconds, 10, 1),
        timeout: seconds(probe.timeout_seconds, 1, 1),
        success_threshold: success,
        failure_threshold: probe.failure_threshold.unwrap_or(3).max(1) as u32,
    }
}

/// One probe of one container: its current result and the run of equal results behind it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracker {
    /// The result as it stands (what readiness and restarts act on).
    pub passing: bool,
    last: Option<bool>,
    run: u32,
    last_probe: Option<Duration>,
}

impl Tracker {
    /// A new container's probe: readiness and startup start failing, liveness passing.
    pub fn new(kind: Kind) -> Tracker {
        Tracker { passing: kind == Kind::Liveness, last: None, run: 0, last_probe: None }
    }

    /// How long until the probe is due (zero: now): first once the initial delay since the
    /// container started has passed, then every period.
    pub fn due_in(&self, timing: &Timing, started: Duration, now: Duration) -> Duration {
        let at = match self.last_probe {
            None => started + timing.initial_delay,
            Some(last) => last + timing.period,
        };
        at.saturating_sub(now)
    }

    /// Takes one result; the standing result changes after `success_threshold` successes or
    /// `failure_threshold` failures in a row. Returns whether it changed.
    pub fn record(&mut self, timing: &Timing, success: bool, now: Duration) -> bool {
        self.last_probe = Some(now);
        self.run = if self.last == Some(success) { self.run + 1 } else { 1 };
        self.last = Some(success);
        let threshold = if success { timing.success_threshold } else { timing.failure_threshold };
        if self.run < threshold || self.passing == success {
            return false;
        }
        self.passing = success;
        true
    }
}

impl Tracker {
    /// Whether the probe has failed `failure_threshold` times in a row (a liveness or startup
    /// probe's container is restarted then).
    pub fn failed(&self, timing: &Timing) -> bool {
        self.last == Some(false) && self.run >= timing.failure_threshold
    }
}

/// Kubelet's message for a container restarted by a probe.
pub fn restart_message(container: &str, kind: Kind) -> String {
    format!("Container {container} failed {} probe, will be restarted", kind.name())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn probe(fields: serde_json::Value) -> Probe {
        serde_json::from_value(fields).unwrap()
    }

    #[test]
    fn defaults_and_bounds() {
        let cases = [
            (
                "defaults",
                json!({}),
                Kind::Readiness,
                Timing {
                    initial_delay: S(0),
                    period: S(10),
                    timeout: S(1),
                    success_threshold: 1,
                    failure_threshold: 3,
                },
            ),
            (
                "written",
                json!({"initialDelaySeconds": 5, "periodSeconds": 2, "timeoutSeconds": 3, "successThreshold": 2, "failureThreshold": 1}),
                Kind::Readiness,
                Timing {
                    initial_delay: S(5),
                    period: S(2),
                    timeout: S(3),
                    success_threshold: 2,
                    failure_threshold: 1,
                },
            ),
            (
                "liveness needs one success",
                json!({"successThreshold": 4}),
                Kind::Liveness,
                Timing {
                    initial_delay: S(0),
                    period: S(10),
                    timeout: S(1),
                    success_threshold: 1,
                    failure_threshold: 3,
                },
            ),
        ];
        for (name, fields, kind, want) in cases {
            assert_eq!(timing(&probe(fields), kind), want, "{name}");
        }
    }

    /// (probe results in order, the standing result after each)
    #[test]
    fn thresholds() {
        let readiness =
            timing(&probe(json!({"successThreshold": 2, "failureThreshold": 2})), Kind::Readiness);
        let liveness = timing(&probe(json!({"failureThreshold": 3})), Kind::Liveness);
        type Row<'a> = (&'a str, Kind, Timing, &'a [bool], &'a [bool]);
        let cases: [Row; 4] = [
            (
                "readiness turns true after two successes",
                Kind::Readiness,
                readiness,
                &[true, true, true],
                &[false, true, true],
            ),
            (
                "a failure breaks the run",
                Kind::Readiness,
                readiness,
                &[true, false, true, true],
                &[false, false, false, true],
            ),
            (
                "readiness turns false after two failures",
                Kind::Readiness,
                readiness,
                &[true, true, false, false],
                &[false, true, true, false],
            ),
            (
                "liveness fails after three in a row",
                Kind::Liveness,
                liveness,
                &[false, false, true, false, false, false],
                &[true, true, true, true, true, false],
            ),
        ];
        for (name, kind, timing, results, want) in cases {
            let mut tracker = Tracker::new(kind);
            let got: Vec<bool> = results
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    tracker.record(&timing, *r, S(i as u64));
                    tracker.passing
                })
                .collect();
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn when_due() {
        let timing = timing(&probe(json!({"initialDelaySeconds": 5, "periodSeconds": 2})), Kind::Readiness);
        let mut tracker = Tracker::new(Kind::Readiness);
        assert_eq!(tracker.due_in(&timing, S(100), S(101)), S(4), "the initial delay");
        assert_eq!(tracker.due_in(&timing, S(100), S(106)), S(0), "due, late");
        tracker.record(&timing, true, S(106));
        assert_eq!(tracker.due_in(&timing, S(100), S(107)), S(1), "a period after the last");
        assert!(!tracker.failed(&timing));
        let once = super::timing(&probe(json!({"failureThreshold": 1})), Kind::Startup);
        let mut startup = Tracker::new(Kind::Startup);
        assert!(!startup.failed(&once), "not failed before its first result");
        startup.record(&once, false, S(1));
        assert!(startup.failed(&once));
    }
}
