//! What a kvol node registers of itself: the host's facts (CPUs, memory, disk, kernel, OS, ids, address) and the runtime's name and version, read once at start.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvol_api::allocatable::{self, Available, Eviction};
use kvol_api::projection::NodeResources;
use kvol_cluster::node_registration::{NodeFacts, PressureWatch};

/// What the node holds back from its pods (kubelet's `--system-reserved`, `--kube-reserved`
/// and `--eviction-hard`), read from the agent's flags.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Budget {
    pub reserved: Vec<NodeResources>,
    pub eviction: Eviction,
}

impl Budget {
    /// The flags' budget, or what is wrong with one of them.
    pub fn of_flags(
        system_reserved: &str,
        kube_reserved: &str,
        eviction_hard: &str,
    ) -> anyhow::Result<Budget> {
        let reserved = |flag: &str, text: &str| {
            allocatable::parse_reserved(text).map_err(|e| anyhow::anyhow!("--{flag}: {e}"))
        };
        Ok(Budget {
            reserved: vec![
                reserved("system-reserved", system_reserved)?,
                reserved("kube-reserved", kube_reserved)?,
            ],
            eviction: allocatable::parse_eviction(eviction_hard)
                .map_err(|e| anyhow::anyhow!("--eviction-hard: {e}"))?,
        })
    }

    /// The node's allocatable, its capacity measured with the filesystem of `state_dir`.
    pub fn allocatable(&self, state_dir: &Path) -> NodeResources {
        allocatable::allocatable(capacity(state_dir), &self.reserved, &self.eviction)
    }
}

/// The node's capacity: its CPUs, its memory, the filesystem holding `state_dir`.
pub fn capacity(state_dir: &Path) -> NodeResources {
    kvol_node::agent::measured_capacity(existing(state_dir))
}

/// What is available now: memory by `/proc/meminfo`'s MemAvailable (kubelet reads its root
/// cgroup's working set; MemAvailable is the kernel's own estimate), and the filesystem holding
/// `state_dir`.
pub fn available(state_dir: &Path) -> Available {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = |key: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let (free, total) = rustix::fs::statvfs(existing(state_dir))
        .map(|s| (s.f_bavail * s.f_frsize, s.f_blocks * s.f_frsize))
        .unwrap_or((0, 0));
    Available {
        memory_bytes: kib("MemAvailable:"),
        memory_capacity: kib("MemTotal:"),
        nodefs_bytes: free,
        nodefs_capacity: total,
    }
}

/// What kvol says in `nodeInfo.kubeletVersion`: the kubelet it stands in for, then its own.
pub fn agent_version() -> String {
    format!("v1.26.0-kvol.{}", env!("CARGO_PKG_VERSION"))
}

/// The node's facts; the runtime's version from CRI's Version at `endpoint`.
pub async fn gather(
    name: &str,
    endpoint: &str,
    max_pods: u32,
    budget: &Budget,
    state_dir: &Path,
) -> NodeFacts {
    let resources = capacity(state_dir);
    let measured: PathBuf = state_dir.to_path_buf();
    NodeFacts {
        name: name.to_string(),
        hostname: name.to_string(),
        internal_ip: host_ip(),
        cpu_millis: resources.cpu_millis,
        memory_bytes: resources.memory_bytes,
        ephemeral_storage_bytes: resources.ephemeral_storage_bytes,
        max_pods,
        architecture: go_arch(std::env::consts::ARCH).to_string(),
        kernel_version: read_trimmed("/proc/sys/kernel/osrelease"),
        os_image: os_image(&read_trimmed("/etc/os-release")),
        machine_id: read_trimmed("/etc/machine-id"),
        system_uuid: read_trimmed("/sys/class/dmi/id/product_uuid"),
        boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
        container_runtime_version: runtime_version(endpoint).await,
        agent_version: agent_version(),
        extra_labels: Default::default(),
        kubelet_port: 0,
        allocatable: Some(budget.allocatable(state_dir)),
        pressure: PressureWatch {
            eviction: budget.eviction,
            measure: Some(Arc::new(move || available(&measured))),
        },
        hugepages: hugepages(Path::new("/sys/kernel/mm/hugepages")),
    }
}

/// Each huge page size under `dir` (`hugepages-2048kB/nr_hugepages`) as kubelet names its
/// resource (`hugepages-2Mi`), with the bytes its pages hold.
fn hugepages(dir: &Path) -> std::collections::BTreeMap<String, u64> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Default::default() };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let kib: u64 = name.strip_prefix("hugepages-")?.strip_suffix("kB")?.parse().ok()?;
            let pages: u64 =
                std::fs::read_to_string(entry.path().join("nr_hugepages")).ok()?.trim().parse().ok()?;
            let size = kvol_cluster::node_registration::binary_si(kib * 1024);
            Some((format!("hugepages-{size}"), pages * kib * 1024))
        })
        .collect()
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// `<runtime name>://<version>` (kubelet's form), or `unknown://` when the runtime does not say.
async fn runtime_version(endpoint: &str) -> String {
    let Ok(cri) = kvol_cri::CriClient::new(endpoint, Default::default()) else { return "unknown://".into() };
    match cri.version(kvol_cri::VersionRequest { version: "v1".into() }).await {
        Ok(v) => format!("{}://{}", v.runtime_name, generic_version(&v.runtime_version)),
        Err(e) => {
            tracing::warn!(error = %e, "the runtime does not say its version");
            "unknown://".into()
        }
    }
}

/// A runtime's version as kubelet writes it (`utilversion.ParseGeneric`): its leading numbers
/// and dots, a leading `v` and any suffix (`~ds1`, `-rc.1`) dropped; as given when it has none.
fn generic_version(version: &str) -> &str {
    let bare = version.strip_prefix('v').unwrap_or(version);
    let end = bare.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(bare.len());
    let numbers = bare[..end].trim_end_matches('.');
    if numbers.is_empty() { version } else { numbers }
}

/// `dir`, or its nearest existing parent when it is not made yet: its filesystem is the one
/// measured (kubelet's ephemeral-storage capacity is its root directory's filesystem).
fn existing(dir: &Path) -> &Path {
    dir.ancestors().find(|d| d.exists()).unwrap_or(Path::new("/"))
}

/// The node's address as a host-network pod sees it: the source address of the default route
/// (nothing is sent), else loopback.
pub(crate) fn host_ip() -> String {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0");
    let local = socket.and_then(|s| s.connect("192.0.2.1:9").and_then(|()| s.local_addr()));
    local.map(|a| a.ip().to_string()).unwrap_or_else(|_| "127.0.0.1".into())
}

/// Go's name of an architecture, as `kubernetes.io/arch` carries it.
pub fn go_arch(rust: &str) -> &str {
    match rust {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// `PRETTY_NAME` of an os-release file, else `Linux`.
fn os_image(os_release: &str) -> String {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| "Linux".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_kubelet_gives_them() {
        assert_eq!((go_arch("x86_64"), go_arch("aarch64"), go_arch("s390x")), ("amd64", "arm64", "s390x"));
        assert_eq!(
            os_image("ID=debian\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n"),
            "Debian GNU/Linux 12 (bookworm)"
        );
        assert_eq!(os_image(""), "Linux");
        assert!(agent_version().starts_with("v1.26.0-kvol."));
        let versions =
            [("1.6.20~ds1", "1.6.20"), ("v1.7.0-rc.1", "1.7.0"), ("1.6.20", "1.6.20"), ("dev", "dev")];
        for (given, want) in versions {
            assert_eq!(generic_version(given), want, "{given}");
        }
    }

    #[test]
    fn huge_page_sizes_as_kubelet_names_them() {
        let dir = tempfile::tempdir().unwrap();
        for (size, pages) in [("2048kB", "3"), ("1048576kB", "0")] {
            let sub = dir.path().join(format!("hugepages-{size}"));
            std::fs::create_dir(&sub).unwrap();
            std::fs::write(sub.join("nr_hugepages"), format!("{pages}\n")).unwrap();
        }
        let found: Vec<(String, u64)> = hugepages(dir.path()).into_iter().collect();
        assert_eq!(found, [("hugepages-1Gi".to_string(), 0), ("hugepages-2Mi".to_string(), 3 << 21)]);
    }

    #[test]
    fn a_state_directory_not_made_yet_counts_its_parents_disk() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = capacity(&dir.path().join("not/made/yet")).ephemeral_storage_bytes;
        assert_eq!(bytes, capacity(dir.path()).ephemeral_storage_bytes);
        assert!(bytes > 0);
    }
}
