//! A container as kubelet asks the runtime for it (kuberuntime_container.go's generateContainerConfig and its Linux part): image, command with `$(VAR)`, environment, mounts from the runtime API, labels, log path, security context, resources; pure.

use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, SecurityContext};
use kvol_cri as cri;
use kvol_runtime_api::proto as rt;

use crate::env::{EnvContext, environment};
use crate::{labels, sandbox};

/// What a container's config is made from besides the pod and the container.
#[derive(Clone, Copy, Debug)]
pub struct ContainerContext<'a> {
    pub env: EnvContext<'a>,
    pub restart_count: u32,
    /// The runtime API's answer for this container.
    pub mounts: &'a rt::ContainerMountsResponse,
    /// The host file bound at the termination message path (kubelet's
    /// `pods/<uid>/containers/<name>/<id>`), when one was made.
    pub termination_log: Option<&'a Path>,
    /// The pod's `etc-hosts` file, bound at `/etc/hosts` unless the container mounts its own.
    pub hosts_file: Option<&'a Path>,
    /// The user the image runs as, as the runtime's ImageStatus says it.
    pub image_user: &'a ImageUser,
}

/// An image's user: a uid, or a name the runtime could not turn into one; neither is root.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageUser {
    pub uid: Option<i64>,
    pub username: String,
}

impl ImageUser {
    /// From the runtime's image status (none: the image is not known).
    pub fn of(image: Option<&cri::Image>) -> ImageUser {
        let uid = image.and_then(|i| i.uid.as_ref()).map(|u| u.value);
        let username = image.map(|i| i.username.clone()).unwrap_or_default();
        ImageUser { uid, username }
    }
}

/// The container's config, or the sentence of kubelet's `CreateContainerConfigError`.
pub fn container_config(
    pod: &Pod,
    container: &Container,
    context: &ContainerContext<'_>,
) -> Result<cri::ContainerConfig, String> {
    let default_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    let security = effective_security(spec, container);
    verify_non_root(pod, container, context.image_user)?;
    let envs = environment(pod, container, &context.env)?;
    let known = |name: &str| envs.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let expand_all = |items: &Option<Vec<String>>| -> Vec<String> {
        items.iter().flatten().map(|item| kvol_api::subpath_expr::expand(item, &known)).collect()
    };
    let mut mounts: Vec<cri::Mount> = context.mounts.mounts.iter().map(mount).collect();
    let message_path =
        container.termination_message_path.as_deref().unwrap_or(labels::DEFAULT_TERMINATION_MESSAGE_PATH);
    if let Some(host) = context.termination_log.filter(|_| !message_path.is_empty()) {
        mounts.push(cri::Mount {
            container_path: message_path.to_string(),
            host_path: host.to_string_lossy().into_owned(),
            readonly: false,
            selinux_relabel: true,
            propagation: cri::MountPropagation::PropagationPrivate as i32,
        });
    }
    if let Some(hosts) = context.hosts_file.filter(|_| !mounts_etc_hosts(container)) {
        mounts.push(cri::Mount {
            container_path: crate::hosts::CONTAINER_PATH.to_string(),
            host_path: hosts.to_string_lossy().into_owned(),
            readonly: false,
            selinux_relabel: true,
            propagation: cri::MountPropagation::PropagationPrivate as i32,
        });
    }
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: container.name.clone(),
            attempt: context.restart_count,
        }),
        image: Some(cri::ImageSpec {
            image: container.image.clone().unwrap_or_default(),
            annotations: Default::default(),
        }),
        command: expand_all(&container.command),
        args: expand_all(&container.args),
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs: envs
            .iter()
            .map(|(key, value)| cri::KeyValue { key: key.clone(), value: value.clone() })
            .collect(),
        mounts,
        devices: context
            .mounts
            .devices
            .iter()
            .map(|d| cri::Device {
                container_path: d.container_path.clone(),
                host_path: d.host_path.clone(),
                permissions: d.permissions.clone(),
            })
            .collect(),
        labels: labels::container_labels(pod, container),
        annotations: labels::container_annotations(pod, container, context.restart_count),
        log_path: log_path(&container.name, context.restart_count),
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(linux_resources(pod, container, context.env.node.memory_bytes)),
            security_context: Some(security),
        }),
    })
}

fn mounts_etc_hosts(container: &Container) -> bool {
    container.volume_mounts.iter().flatten().any(|m| m.mount_path == crate::hosts::CONTAINER_PATH)
}

/// `<container>/<restart count>.log`, beneath the sandbox's log directory.
pub fn log_path(container: &str, restart_count: u32) -> String {
    format!("{container}/{restart_count}.log")
}

fn mount(m: &rt::Mount) -> cri::Mount {
    let propagation = match rt::MountPropagation::try_from(m.propagation) {
        Ok(rt::MountPropagation::PropagationHostToContainer) => {
            cri::MountPropagation::PropagationHostToContainer
        }
        Ok(rt::MountPropagation::PropagationBidirectional) => cri::MountPropagation::PropagationBidirectional,
        _ => cri::MountPropagation::PropagationPrivate,
    };
    cri::Mount {
        container_path: m.container_path.clone(),
        host_path: m.host_path.clone(),
        readonly: m.readonly,
        selinux_relabel: m.selinux_relabel,
        propagation: propagation as i32,
    }
}

/// The container's security context over the pod's (kubelet's
/// `determineEffectiveSecurityContext`), in CRI's words.
pub fn effective_security(spec: &PodSpec, container: &Container) -> cri::LinuxContainerSecurityContext {
    let pod_sc = spec.security_context.clone().unwrap_or_default();
    let sc: SecurityContext = container.security_context.clone().unwrap_or_default();
    let run_as_user = sc.run_as_user.or(pod_sc.run_as_user);
    let run_as_group = sc.run_as_group.or(pod_sc.run_as_group);
    let capabilities = sc.capabilities.as_ref().map(|c| cri::Capability {
        add_capabilities: c.add.clone().unwrap_or_default(),
        drop_capabilities: c.drop.clone().unwrap_or_default(),
    });
    cri::LinuxContainerSecurityContext {
        capabilities,
        privileged: sc.privileged.unwrap_or(false),
        namespace_options: Some(sandbox::namespace_options(spec)),
        run_as_user: run_as_user.map(|value| cri::Int64Value { value }),
        run_as_username: String::new(),
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        supplemental_groups: sandbox::supplemental_groups(spec),
        no_new_privs: sc.allow_privilege_escalation == Some(false),
        run_as_group: run_as_group.map(|value| cri::Int64Value { value }),
        masked_paths: Vec::new(),
        readonly_paths: Vec::new(),
        seccomp: Some(sandbox::seccomp(sc.seccomp_profile.as_ref().or(pod_sc.seccomp_profile.as_ref()))),
    }
}

/// Kubelet's `verifyRunAsNonRoot`: under `runAsNonRoot`, a root `runAsUser` is refused, and
/// without one the image's user decides (no user at all is root; a name cannot be checked).
pub fn verify_non_root(pod: &Pod, container: &Container, image: &ImageUser) -> Result<(), String> {
    let spec = pod.spec.as_ref();
    let pod_sc = spec.and_then(|s| s.security_context.as_ref());
    let sc = container.security_context.as_ref();
    if !sc.and_then(|s| s.run_as_non_root).or(pod_sc.and_then(|s| s.run_as_non_root)).unwrap_or(false) {
        return Ok(());
    }
    let pod_name = labels::PodIds::of(pod).kubelet_format();
    let name = &container.name;
    let image_root = image.uid == Some(0) || (image.uid.is_none() && image.username.is_empty());
    match sc.and_then(|s| s.run_as_user).or(pod_sc.and_then(|s| s.run_as_user)) {
        Some(0) => Err(format!(
            "container's runAsUser breaks non-root policy (pod: {pod_name:?}, container: {name})"
        )),
        Some(_) => Ok(()),
        None if image_root => Err(format!(
            "container has runAsNonRoot and image will run as root (pod: {pod_name:?}, container: {name})"
        )),
        None if image.uid.is_none() => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({}), cannot verify user is non-root (pod: {pod_name:?}, container: {name})",
            image.username
        )),
        None => Ok(()),
    }
}

/// A pod's QoS class, as kubelet's `GetPodQOS` decides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

fn quantity(container: &Container, which: &str, kind: &str) -> Option<String> {
    let resources = container.resources.as_ref()?;
    let map = if which == "limits" { resources.limits.as_ref() } else { resources.requests.as_ref() };
    map?.get(kind).map(|q| q.0.clone())
}

/// A request as the API server defaults it: the request, else the limit.
fn request(container: &Container, kind: &str) -> Option<String> {
    quantity(container, "requests", kind).or_else(|| quantity(container, "limits", kind))
}

/// A container's request of `kind` (`cpu` in thousandths, else bytes) as the API server
/// defaults it: the request, else the limit, else 0.
pub fn requested(container: &Container, kind: &str) -> u64 {
    request(container, kind).map_or(0, |q| amount(kind, &q))
}

fn millis(cpu: &str) -> u64 {
    kvol_api::downward::resource_value("limits.cpu", cpu, Some("1m"))
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn bytes(memory: &str) -> u64 {
    kvol_api::quantity::parse_bytes(memory).unwrap_or(0)
}

/// A CPU quantity in thousandths, a memory quantity in bytes.
fn amount(kind: &str, text: &str) -> u64 {
    if kind == "cpu" { millis(text) } else { bytes(text) }
}

pub fn qos_class(spec: &PodSpec) -> QosClass {
    let all: Vec<&Container> = spec.containers.iter().chain(spec.init_containers.iter().flatten()).collect();
    let any_set = all.iter().any(|c| {
        ["cpu", "memory"].iter().any(|k| {
            quantity(c, "requests", k).is_some_and(|q| amount(k, &q) > 0)
                || quantity(c, "limits", k).is_some_and(|q| amount(k, &q) > 0)
        })
    });
    if !any_set {
        return QosClass::BestEffort;
    }
    let guaranteed = all.iter().all(|c| {
        ["cpu", "memory"].iter().all(|k| match (quantity(c, "limits", k), request(c, k)) {
            (Some(limit), Some(request)) => amount(k, &limit) == amount(k, &request),
            _ => false,
        })
    });
    if guaranteed { QosClass::Guaranteed } else { QosClass::Burstable }
}

/// CPU shares for a request in thousandths of a CPU (kubelet's `milliCPUToShares`: 2 at least).
pub fn cpu_shares(milli: u64) -> i64 {
    ((milli * 1024 / 1000) as i64).clamp(2, 262_144)
}

/// The container's cgroup as kubelet asks for it: shares from the CPU request, a CFS quota of
/// a 100 ms period from the CPU limit (1 ms at least), the memory limit, and the OOM score
/// adjustment of the pod's QoS class (`node_memory` sizes a burstable container's).
pub fn linux_resources(pod: &Pod, container: &Container, node_memory: u64) -> cri::LinuxContainerResources {
    const PERIOD: u64 = 100_000;
    let default_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    let cpu_request = request(container, "cpu").map(|q| millis(&q)).unwrap_or(0);
    let cpu_limit = quantity(container, "limits", "cpu").map(|q| millis(&q)).unwrap_or(0);
    let memory_limit = quantity(container, "limits", "memory").map(|q| bytes(&q)).unwrap_or(0);
    let memory_request = request(container, "memory").map(|q| bytes(&q)).unwrap_or(0);
    let (cpu_period, cpu_quota) =
        if cpu_limit > 0 { (PERIOD as i64, ((cpu_limit * PERIOD / 1000).max(1000)) as i64) } else { (0, 0) };
    cri::LinuxContainerResources {
        cpu_period,
        cpu_quota,
        cpu_shares: cpu_shares(cpu_request),
        memory_limit_in_bytes: memory_limit as i64,
        oom_score_adj: oom_score_adj(qos_class(spec), memory_request, node_memory),
        ..Default::default()
    }
}

/// Kubelet's `GetContainerOOMScoreAdjust`.
pub fn oom_score_adj(qos: QosClass, memory_request: u64, node_memory: u64) -> i64 {
    match qos {
        QosClass::Guaranteed => -997,
        QosClass::BestEffort => 1000,
        QosClass::Burstable => {
            let adjust = 1000 - (1000 * memory_request as i128 / node_memory.max(1) as i128) as i64;
            if adjust < 3 {
                3
            } else if adjust == 1000 {
                999
            } else {
                adjust
            }
        }
    }
}

#[cfg(test)]
#[path = "container_tests.rs"]
mod tests;
