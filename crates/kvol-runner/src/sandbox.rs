//! A pod's sandbox as kubelet asks the runtime for it (kuberuntime_sandbox.go's generatePodSandboxConfig, dns.go): metadata, hostname, DNS, namespaces, ports, log directory, labels; pure.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod, PodSpec, SeccompProfile};
use kvol_cri as cri;

use crate::labels::{self, PodIds};

/// What a sandbox is made from besides the pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SandboxContext {
    /// Where pods' log directories go (`/var/log/pods`).
    pub log_root: PathBuf,
    /// The host's resolv.conf, as text.
    pub host_resolv_conf: String,
    /// The cluster's DNS servers (kubelet's `clusterDNS`); none standalone.
    pub cluster_dns: Vec<String>,
    /// The cluster's domain (kubelet's `clusterDomain`, `cluster.local`).
    pub cluster_domain: String,
}

/// `<log root>/<namespace>_<name>_<uid>`, kubelet's pod log directory.
pub fn log_directory(log_root: &Path, pod: &Pod) -> PathBuf {
    let ids = PodIds::of(pod);
    log_root.join(format!("{}_{}_{}", ids.namespace, ids.name, ids.uid))
}

/// The sandbox config of `pod`'s `attempt`th sandbox.
pub fn sandbox_config(pod: &Pod, attempt: u32, context: &SandboxContext) -> cri::PodSandboxConfig {
    let ids = PodIds::of(pod);
    let default_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    let host_network = spec.host_network.unwrap_or(false);
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: ids.name.to_string(),
            uid: ids.uid.to_string(),
            namespace: ids.namespace.to_string(),
            attempt,
        }),
        hostname: if host_network { String::new() } else { hostname(pod) },
        log_directory: log_directory(&context.log_root, pod).to_string_lossy().into_owned(),
        dns_config: Some(dns_config(pod, context)),
        port_mappings: port_mappings(spec),
        labels: labels::sandbox_labels(pod),
        annotations: labels::sandbox_annotations(pod),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: String::new(),
            security_context: Some(sandbox_security(spec)),
            sysctls: spec
                .security_context
                .iter()
                .flat_map(|sc| sc.sysctls.iter().flatten())
                .map(|s| (s.name.clone(), s.value.clone()))
                .collect(),
        }),
    }
}

/// The pod's hostname: `spec.hostname`, else its name, cut to 63 characters with trailing
/// `-` and `.` dropped (kubelet's `truncatePodHostnameIfNeeded`).
pub fn hostname(pod: &Pod) -> String {
    let spec_name = pod.spec.as_ref().and_then(|s| s.hostname.clone()).filter(|h| !h.is_empty());
    let name = spec_name.unwrap_or_else(|| PodIds::of(pod).name.to_string());
    if name.len() <= 63 {
        return name;
    }
    name[..63].trim_end_matches(['-', '.']).to_string()
}

/// The namespaces a pod's sandbox and containers share with the node or with each other.
pub fn namespace_options(spec: &PodSpec) -> cri::NamespaceOption {
    let mode = |host: Option<bool>, otherwise: cri::NamespaceMode| {
        if host.unwrap_or(false) { cri::NamespaceMode::Node as i32 } else { otherwise as i32 }
    };
    let pid_otherwise = if spec.share_process_namespace.unwrap_or(false) {
        cri::NamespaceMode::Pod
    } else {
        cri::NamespaceMode::Container
    };
    cri::NamespaceOption {
        network: mode(spec.host_network, cri::NamespaceMode::Pod),
        pid: mode(spec.host_pid, pid_otherwise),
        ipc: mode(spec.host_ipc, cri::NamespaceMode::Pod),
        target_id: String::new(),
    }
}

fn sandbox_security(spec: &PodSpec) -> cri::LinuxSandboxSecurityContext {
    let sc = spec.security_context.clone().unwrap_or_default();
    let privileged = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| c.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false));
    cri::LinuxSandboxSecurityContext {
        namespace_options: Some(namespace_options(spec)),
        run_as_user: sc.run_as_user.map(|value| cri::Int64Value { value }),
        run_as_group: sc.run_as_group.map(|value| cri::Int64Value { value }),
        readonly_rootfs: false,
        supplemental_groups: supplemental_groups(spec),
        privileged,
        seccomp: Some(seccomp(sc.seccomp_profile.as_ref())),
    }
}

/// The pod's groups as kubelet gives them to every container: `fsGroup` first, then
/// `supplementalGroups`.
pub fn supplemental_groups(spec: &PodSpec) -> Vec<i64> {
    let sc = spec.security_context.as_ref();
    let fs_group = sc.and_then(|s| s.fs_group);
    fs_group.into_iter().chain(sc.and_then(|s| s.supplemental_groups.clone()).unwrap_or_default()).collect()
}

/// A seccomp profile in CRI's words; none is `Unconfined`, as kubelet v1.26 runs a pod
/// without one (SeccompDefault off).
pub fn seccomp(profile: Option<&SeccompProfile>) -> cri::SecurityProfile {
    use cri::security_profile::ProfileType;
    match profile.map(|p| (p.type_.as_str(), p.localhost_profile.as_deref())) {
        Some(("RuntimeDefault", _)) => cri::SecurityProfile {
            profile_type: ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        },
        Some(("Localhost", Some(path))) => cri::SecurityProfile {
            profile_type: ProfileType::Localhost as i32,
            localhost_ref: path.to_string(),
        },
        _ => cri::SecurityProfile {
            profile_type: ProfileType::Unconfined as i32,
            localhost_ref: String::new(),
        },
    }
}

fn port_mappings(spec: &PodSpec) -> Vec<cri::PortMapping> {
    let protocol = |p: Option<&str>| match p {
        Some("UDP") => cri::Protocol::Udp as i32,
        Some("SCTP") => cri::Protocol::Sctp as i32,
        _ => cri::Protocol::Tcp as i32,
    };
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .map(|p| cri::PortMapping {
            protocol: protocol(p.protocol.as_deref()),
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect()
}

/// How a pod's DNS is made (kubelet's `getPodDNSType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DnsType {
    Cluster,
    Host,
    None,
}

fn dns_type(spec: &PodSpec, has_cluster_dns: bool) -> DnsType {
    let host_network = spec.host_network.unwrap_or(false);
    let wanted = match spec.dns_policy.as_deref().unwrap_or("ClusterFirst") {
        "None" => DnsType::None,
        "ClusterFirstWithHostNet" => DnsType::Cluster,
        "ClusterFirst" if !host_network => DnsType::Cluster,
        _ => DnsType::Host,
    };
    // No cluster DNS known: kubelet falls back to the host's.
    if wanted == DnsType::Cluster && !has_cluster_dns { DnsType::Host } else { wanted }
}

/// The pod's DNS config: by its `dnsPolicy` from the host's resolv.conf or the cluster's DNS,
/// with its own `dnsConfig` laid over.
pub fn dns_config(pod: &Pod, context: &SandboxContext) -> cri::DnsConfig {
    let default_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    let host = parse_resolv_conf(&context.host_resolv_conf);
    let mut config = match dns_type(spec, !context.cluster_dns.is_empty()) {
        DnsType::None => cri::DnsConfig::default(),
        DnsType::Host => host,
        DnsType::Cluster => {
            let ns = PodIds::of(pod).namespace.to_string();
            let domain = &context.cluster_domain;
            let mut searches = vec![format!("{ns}.svc.{domain}"), format!("svc.{domain}"), domain.clone()];
            searches.extend(host.searches);
            cri::DnsConfig { servers: context.cluster_dns.clone(), searches, options: vec!["ndots:5".into()] }
        }
    };
    if let Some(own) = &spec.dns_config {
        config.servers.extend(own.nameservers.iter().flatten().cloned());
        config.servers = without_duplicates(std::mem::take(&mut config.servers));
        config.searches.extend(own.searches.iter().flatten().cloned());
        config.searches = without_duplicates(std::mem::take(&mut config.searches));
        for option in own.options.iter().flatten() {
            let text = match &option.value {
                Some(value) => format!("{}:{value}", option.name.clone().unwrap_or_default()),
                None => option.name.clone().unwrap_or_default(),
            };
            merge_option(&mut config.options, text);
        }
    }
    config
}

/// An option replaces one of the same name (`ndots:5` replaces `ndots:1`).
fn merge_option(options: &mut Vec<String>, option: String) {
    let name = |o: &str| o.split(':').next().unwrap_or_default().to_string();
    let wanted = name(&option);
    match options.iter_mut().find(|o| name(o) == wanted) {
        Some(existing) => *existing = option,
        None => options.push(option),
    }
}

fn without_duplicates(items: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    items.into_iter().filter(|i| seen.insert(i.clone())).collect()
}

/// resolv.conf as kubelet reads it: `nameserver`s, the last `search` line (root `.` dropped,
/// trailing dots trimmed), every `options` word; comments after `#` or `;`.
pub fn parse_resolv_conf(text: &str) -> cri::DnsConfig {
    let mut config = cri::DnsConfig::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or_default();
        let mut fields = line.split_whitespace();
        match (fields.next(), fields.collect::<Vec<_>>()) {
            (Some("nameserver"), rest) if !rest.is_empty() => config.servers.push(rest[0].to_string()),
            (Some("search"), rest) => {
                config.searches =
                    rest.iter().filter(|s| **s != ".").map(|s| s.trim_end_matches('.').to_string()).collect()
            }
            (Some("options"), rest) => {
                rest.iter().for_each(|o| merge_option(&mut config.options, o.to_string()))
            }
            _ => {}
        }
    }
    config
}

#[cfg(test)]
#[path = "sandbox_tests.rs"]
mod tests;
