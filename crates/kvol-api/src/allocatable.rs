//! A node's allocatable resources and its pressure, as kubelet works them out: capacity less `--system-reserved`, `--kube-reserved` and the hard eviction thresholds (`--eviction-hard`, by default `memory.available<100Mi,nodefs.available<10%,imagefs.available<15%,nodefs.inodesFree<5%`), and memory or disk pressure while what is available is under its threshold; pure.

use crate::projection::NodeResources;

/// kubelet's default `--eviction-hard`.
pub const DEFAULT_EVICTION_HARD: &str =
    "memory.available<100Mi,nodefs.available<10%,imagefs.available<15%,nodefs.inodesFree<5%";

/// The signals kubelet knows that kvol accepts but does not measure (no image filesystem of
/// its own, no inode or PID eviction).
const UNMEASURED_SIGNALS: [&str; 5] = [
    "imagefs.available",
    "nodefs.inodesFree",
    "imagefs.inodesFree",
    "pid.available",
    "allocatableMemory.available",
];

/// A threshold: an amount, or a share of the capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Threshold {
    Bytes(u64),
    Percent(f64),
}

impl Threshold {
    /// The threshold in bytes of `capacity`.
    pub fn of(self, capacity: u64) -> u64 {
        match self {
            Threshold::Bytes(bytes) => bytes,
            Threshold::Percent(percent) => (capacity as f64 * percent / 100.0) as u64,
        }
    }
}

/// The hard eviction thresholds kvol measures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Eviction {
    pub memory_available: Option<Threshold>,
    pub nodefs_available: Option<Threshold>,
}

/// `cpu=100m,memory=256Mi,ephemeral-storage=1Gi` (kubelet's `--system-reserved` and
/// `--kube-reserved`); empty: nothing reserved.
pub fn parse_reserved(text: &str) -> Result<NodeResources, String> {
    let mut reserved = NodeResources::default();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').ok_or_else(|| format!("{pair:?}: not resource=quantity"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{pair:?}: {e}");
        match name.trim() {
            "cpu" => reserved.cpu_millis = cpu_millis(value.trim()).map_err(|e| bad(&e))?,
            "memory" => {
                reserved.memory_bytes = crate::quantity::parse_bytes(value.trim()).map_err(|e| bad(&e))?
            }
            "ephemeral-storage" => {
                reserved.ephemeral_storage_bytes =
                    crate::quantity::parse_bytes(value.trim()).map_err(|e| bad(&e))?
            }
            "pid" => {}
            other => return Err(format!("{pair:?}: {other:?} is not cpu, memory, ephemeral-storage or pid")),
        }
    }
    Ok(reserved)
}

fn cpu_millis(text: &str) -> Result<u64, String> {
    crate::downward::resource_value("limits.cpu", text, Some("1m"))?
        .parse()
        .map_err(|_| format!("{text:?} is not a cpu quantity"))
}

/// `memory.available<100Mi,nodefs.available<10%` (kubelet's `--eviction-hard`).
pub fn parse_eviction(text: &str) -> Result<Eviction, String> {
    let mut eviction = Eviction::default();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (signal, value) = item.split_once('<').ok_or_else(|| format!("{item:?}: not signal<quantity"))?;
        let threshold = match value.trim().strip_suffix('%') {
            Some(percent) => Threshold::Percent(
                percent
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=100.0).contains(p))
                    .ok_or_else(|| format!("{item:?}: not a percentage"))?,
            ),
            None => Threshold::Bytes(
                crate::quantity::parse_bytes(value.trim()).map_err(|e| format!("{item:?}: {e}"))?,
            ),
        };
        match signal.trim() {
            "memory.available" => eviction.memory_available = Some(threshold),
            "nodefs.available" => eviction.nodefs_available = Some(threshold),
            known if UNMEASURED_SIGNALS.contains(&known) => {}
            other => return Err(format!("{item:?}: {other:?} is not an eviction signal")),
        }
    }
    Ok(eviction)
}

/// kubelet's allocatable: capacity less every reservation and the hard eviction thresholds of
/// memory and the node's filesystem; never below zero.
pub fn allocatable(
    capacity: NodeResources,
    reserved: &[NodeResources],
    eviction: &Eviction,
) -> NodeResources {
    let sum = |f: fn(&NodeResources) -> u64| reserved.iter().map(f).sum::<u64>();
    let threshold = |t: Option<Threshold>, capacity: u64| t.map_or(0, |t| t.of(capacity));
    NodeResources {
        cpu_millis: capacity.cpu_millis.saturating_sub(sum(|r| r.cpu_millis)),
        memory_bytes: capacity.memory_bytes.saturating_sub(
            sum(|r| r.memory_bytes) + threshold(eviction.memory_available, capacity.memory_bytes),
        ),
        ephemeral_storage_bytes: capacity.ephemeral_storage_bytes.saturating_sub(
            sum(|r| r.ephemeral_storage_bytes)
                + threshold(eviction.nodefs_available, capacity.ephemeral_storage_bytes),
        ),
    }
}

/// What is available now, and of what.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Available {
    pub memory_bytes: u64,
    pub memory_capacity: u64,
    pub nodefs_bytes: u64,
    pub nodefs_capacity: u64,
}

/// The node's pressure conditions (kubelet's MemoryPressure and DiskPressure; no PID
/// threshold is kept, as kubelet keeps none by default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Pressure {
    pub memory: bool,
    pub disk: bool,
}

/// Under pressure while what is available is under its threshold.
pub fn pressure(available: &Available, eviction: &Eviction) -> Pressure {
    let under = |t: Option<Threshold>, left: u64, capacity: u64| t.is_some_and(|t| left < t.of(capacity));
    Pressure {
        memory: under(eviction.memory_available, available.memory_bytes, available.memory_capacity),
        disk: under(eviction.nodefs_available, available.nodefs_bytes, available.nodefs_capacity),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;
    const MI: u64 = 1 << 20;

    #[test]
    fn reservations_read_as_kubelet_reads_them() {
        // (text, parsed or the error's start)
        let table: [(&str, Result<NodeResources, &str>); 5] = [
            ("", Ok(NodeResources::default())),
            (
                "cpu=100m, memory=256Mi,ephemeral-storage=1Gi",
                Ok(NodeResources { cpu_millis: 100, memory_bytes: 256 * MI, ephemeral_storage_bytes: GI }),
            ),
            ("cpu=1,pid=100", Ok(NodeResources { cpu_millis: 1000, ..Default::default() })),
            ("gpu=1", Err("\"gpu=1\": \"gpu\" is not")),
            ("memory", Err("\"memory\": not resource=quantity")),
        ];
        for (text, want) in table {
            match (parse_reserved(text), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{text}"),
                (Err(got), Err(start)) => assert!(got.starts_with(start), "{text}: {got}"),
                (got, want) => panic!("{text}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn eviction_thresholds_and_the_allocatable_they_leave() {
        let default = parse_eviction(DEFAULT_EVICTION_HARD).unwrap();
        assert_eq!(
            default,
            Eviction {
                memory_available: Some(Threshold::Bytes(100 * MI)),
                nodefs_available: Some(Threshold::Percent(10.0))
            }
        );
        assert!(parse_eviction("memory.available<lots").is_err());
        assert!(parse_eviction("memory.free<1Gi").unwrap_err().contains("not an eviction signal"));
        assert!(parse_eviction("nodefs.available<120%").is_err());
        let capacity =
            NodeResources { cpu_millis: 2000, memory_bytes: 4 * GI, ephemeral_storage_bytes: 100 * GI };
        let system = parse_reserved("cpu=100m,memory=256Mi").unwrap();
        let kube = parse_reserved("cpu=200m,memory=256Mi,ephemeral-storage=5Gi").unwrap();
        // (what, reservations, eviction, allocatable)
        let table = [
            ("nothing held back", vec![], Eviction::default(), capacity),
            (
                "kubelet's defaults only",
                vec![],
                default,
                NodeResources {
                    cpu_millis: 2000,
                    memory_bytes: 4 * GI - 100 * MI,
                    ephemeral_storage_bytes: 90 * GI,
                },
            ),
            (
                "reserved and evicted",
                vec![system, kube],
                default,
                NodeResources {
                    cpu_millis: 1700,
                    memory_bytes: 4 * GI - 612 * MI,
                    ephemeral_storage_bytes: 85 * GI,
                },
            ),
            (
                "more reserved than there is",
                vec![parse_reserved("cpu=3,memory=8Gi").unwrap()],
                Eviction::default(),
                NodeResources { cpu_millis: 0, memory_bytes: 0, ephemeral_storage_bytes: 100 * GI },
            ),
        ];
        for (what, reserved, eviction, want) in table {
            assert_eq!(allocatable(capacity, &reserved, &eviction), want, "{what}");
        }
    }

    #[test]
    fn pressure_while_under_a_threshold() {
        let eviction = parse_eviction(DEFAULT_EVICTION_HARD).unwrap();
        let available = |memory: u64, disk: u64| Available {
            memory_bytes: memory,
            memory_capacity: 4 * GI,
            nodefs_bytes: disk,
            nodefs_capacity: 100 * GI,
        };
        // (memory available, disk available, pressure)
        let table = [
            (GI, 50 * GI, Pressure { memory: false, disk: false }),
            (99 * MI, 50 * GI, Pressure { memory: true, disk: false }),
            (GI, 9 * GI, Pressure { memory: false, disk: true }),
            (100 * MI, 10 * GI, Pressure { memory: false, disk: false }),
        ];
        for (memory, disk, want) in table {
            assert_eq!(pressure(&available(memory, disk), &eviction), want, "{memory} {disk}");
        }
        assert_eq!(
            pressure(&available(0, 0), &Eviction::default()),
            Pressure::default(),
            "no thresholds, no pressure"
        );
    }
}
