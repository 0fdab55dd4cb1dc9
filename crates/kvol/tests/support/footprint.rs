//! A process's footprint from /proc: its resident memory and the CPU time it has used.
// Compiled into every test binary that has `support`; only the benches use it.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

/// `VmRSS` of the process `pid`, in KiB.
pub fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The CPU time (utime + stime) the process `pid` has used, its threads included.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat")).ok()?;
    // The fields after the command's closing parenthesis: state is the first, utime the 12th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let per_second = rustix::param::clock_ticks_per_second();
    Some(Duration::from_secs_f64(ticks as f64 / per_second as f64))
}
