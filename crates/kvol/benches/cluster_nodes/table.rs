//! The side-by-side bench's table: each node's figures, the ratio kubelet/kvol, and whether the goals are met.

use std::time::Duration;

use super::timings::quantile;

/// What one node's run measured.
pub struct Run {
    pub node: String,
    /// Watched created → Ready, sorted.
    pub latencies: Vec<Duration>,
    /// The API's creationTimestamp → Ready lastTransitionTime, sorted (whole seconds).
    pub api_latencies: Vec<Duration>,
    /// The Deployment created → all its pods Ready.
    pub all_ready: Duration,
    /// The Deployment deleted → no pod of it left.
    pub all_gone: Duration,
    /// The agent's CPU time from the Deployment's creation to all Ready, and to all gone.
    pub cpu_to_ready: Duration,
    pub cpu_whole: Duration,
    pub rss_idle_kib: Option<u64>,
    pub rss_running_kib: Option<u64>,
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

fn kib(v: Option<u64>) -> String {
    v.map(|v| format!("{v} KiB")).unwrap_or_else(|| "-".into())
}

fn row(what: &str, kvol: String, kubelet: String, ratio: String) {
    println!("{what:<38} {kvol:>12} {kubelet:>14} {ratio:>14}");
}

fn time_row(what: &str, kvol: Duration, kubelet: Duration) {
    let ratio = format!("{:.1}×", kubelet.as_secs_f64() / kvol.as_secs_f64().max(1e-9));
    row(what, ms(kvol), ms(kubelet), ratio);
}

fn kib_row(what: &str, kvol: Option<u64>, kubelet: Option<u64>) {
    let ratio = kvol.zip(kubelet).map(|(a, b)| format!("{:.1}×", b as f64 / a as f64)).unwrap_or("-".into());
    row(what, kib(kvol), kib(kubelet), ratio);
}

/// The table of both runs, then the goals (p99 ≤ 1/5 of kubelet's, RSS ≤ 1/3) met or not.
pub fn print(kvol: &Run, kubelet: &Run, pods: usize) {
    println!();
    row("", kvol.node.clone(), kubelet.node.clone(), "kubelet/kvol".into());
    for (name, q) in [("p50", 0.5), ("p99", 0.99), ("max", 1.0)] {
        let what = format!("created → Ready {name} (watched)");
        time_row(&what, quantile(&kvol.latencies, q), quantile(&kubelet.latencies, q));
    }
    for (name, q) in [("p50", 0.5), ("p99", 0.99)] {
        let what = format!("created → Ready {name} (API times, 1 s)");
        time_row(&what, quantile(&kvol.api_latencies, q), quantile(&kubelet.api_latencies, q));
    }
    time_row(&format!("deployment → all {pods} Ready"), kvol.all_ready, kubelet.all_ready);
    time_row("deployment deleted → all pods gone", kvol.all_gone, kubelet.all_gone);
    time_row("agent CPU, created → all Ready", kvol.cpu_to_ready, kubelet.cpu_to_ready);
    time_row("agent CPU, created → all gone", kvol.cpu_whole, kubelet.cpu_whole);
    kib_row("agent RSS idle", kvol.rss_idle_kib, kubelet.rss_idle_kib);
    kib_row(&format!("agent RSS, {pods} pods running"), kvol.rss_running_kib, kubelet.rss_running_kib);
    let p99 = |r: &Run| quantile(&r.latencies, 0.99).as_secs_f64();
    let p99_met = p99(kvol) * 5.0 <= p99(kubelet);
    let rss_met = kvol.rss_running_kib.zip(kubelet.rss_running_kib).map(|(a, b)| a * 3 <= b);
    println!(
        "\ngoal p99 ≤ 1/5 of kubelet's: {}; goal RSS ≤ 1/3 of kubelet's: {}",
        if p99_met { "met" } else { "NOT met" },
        match rss_met {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "unknown (no RSS read)",
        }
    );
}
