//! Whether the node takes a pod, as kubelet's admission decides it (lifecycle/predicate.go's generalFilter over the scheduler's AdmissionCheck): room for one more pod and for its requests beside the pods admitted before it, its nodeSelector and required node affinity matched by the node's labels, its host ports free, and no NoExecute taint it does not tolerate; pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec, Taint};
use kvol_api::projection::NodeResources;

use crate::container::requested;

/// The node a pod is admitted to.
#[derive(Clone, Copy, Debug)]
pub struct NodeView<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub allocatable: NodeResources,
    pub max_pods: u32,
    pub taints: &'a [Taint],
}

/// What an admitted pod takes of the node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Share {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub ephemeral_storage_bytes: u64,
    /// `(protocol, host IP, host port)` of each port it holds on the node.
    pub host_ports: Vec<(String, String, i32)>,
}

/// A refusal: kubelet's status reason (`OutOfcpu`, `NodeAffinity`, …) and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

/// What `pod` takes of the node: its effective requests (the larger of its containers' sum and
/// any one init container, plus its overhead) and its host ports.
pub fn share_of(pod: &Pod) -> Share {
    let default_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    let effective = |kind: &str| {
        let sum: u64 = spec.containers.iter().map(|c| requested(c, kind)).sum();
        let init = spec.init_containers.iter().flatten().map(|c| requested(c, kind)).max().unwrap_or(0);
        let overhead = spec.overhead.as_ref().and_then(|o| o.get(kind)).map_or(0, |q| {
            if kind == "cpu" {
                kvol_api::downward::resource_value("limits.cpu", &q.0, Some("1m"))
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            } else {
                kvol_api::quantity::parse_bytes(&q.0).unwrap_or(0)
            }
        });
        sum.max(init) + overhead
    };
    let host_ports = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|port| *port > 0)?;
            let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
            Some((protocol, p.host_ip.clone().unwrap_or_else(|| "0.0.0.0".into()), port))
        })
        .collect();
    Share {
        cpu_millis: effective("cpu"),
        memory_bytes: effective("memory"),
        ephemeral_storage_bytes: effective("ephemeral-storage"),
        host_ports,
    }
}

/// Admits `pod` beside the pods that hold `others`, or says why not (the first failure, in
/// kubelet's order: resources, node affinity, node ports, taints).
pub fn admit(pod: &Pod, node: &NodeView<'_>, others: &[Share]) -> Result<Share, Rejection> {
    let share = share_of(pod);
    let default_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    if let Some(rejection) = resources(&share, node, others) {
        return Err(rejection);
    }
    let predicate =
        |name: &str| Rejection { reason: name.into(), message: format!("Predicate {name} failed") };
    if !node_affinity_matches(spec, node) {
        return Err(predicate("NodeAffinity"));
    }
    if ports_taken(&share, others) {
        return Err(predicate("NodePorts"));
    }
    if !is_static(pod) && untolerated_no_execute(spec, node.taints) {
        return Err(predicate("TaintToleration"));
    }
    Ok(share)
}

/// The scheduler's resource fit as kubelet reads it: the pod count first, then CPU, memory and
/// ephemeral storage (only when the pod requests any).
fn resources(share: &Share, node: &NodeView<'_>, others: &[Share]) -> Option<Rejection> {
    let short = |name: &str, requested: u64, used: u64, capacity: u64| Rejection {
        reason: format!("OutOf{name}"),
        message: format!(
            "Node didn't have enough resource: {name}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    };
    if others.len() as u64 + 1 > u64::from(node.max_pods) {
        return Some(short("pods", 1, others.len() as u64, u64::from(node.max_pods)));
    }
    let checks = [
        (
            "cpu",
            share.cpu_millis,
            others.iter().map(|o| o.cpu_millis).sum::<u64>(),
            node.allocatable.cpu_millis,
        ),
        (
            "memory",
            share.memory_bytes,
            others.iter().map(|o| o.memory_bytes).sum::<u64>(),
            node.allocatable.memory_bytes,
        ),
        (
            "ephemeral-storage",
            share.ephemeral_storage_bytes,
            others.iter().map(|o| o.ephemeral_storage_bytes).sum::<u64>(),
            node.allocatable.ephemeral_storage_bytes,
        ),
    ];
    checks
        .into_iter()
        .find(|(_, requested, used, capacity)| *requested > 0 && requested + used > *capacity)
        .map(|(name, requested, used, capacity)| short(name, requested, used, capacity))
}

/// A static pod (from a manifests directory): kubelet skips the taint check for it.
fn is_static(pod: &Pod) -> bool {
    let annotations = pod.metadata.annotations.as_ref();
    annotations.and_then(|a| a.get("kubernetes.io/config.source")).is_some_and(|s| s != "api")
}

/// `nodeSelector` and the required node affinity (its terms ORed, each term's expressions
/// ANDed; `matchFields` on `metadata.name`).
fn node_affinity_matches(spec: &PodSpec, node: &NodeView<'_>) -> bool {
    let selector_ok = spec.node_selector.iter().flatten().all(|(k, v)| node.labels.get(k) == Some(v));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref());
    selector_ok && required.is_none_or(|r| r.node_selector_terms.iter().any(|t| term_matches(t, node)))
}

fn term_matches(term: &NodeSelectorTerm, node: &NodeView<'_>) -> bool {
    let expressions = term.match_expressions.iter().flatten();
    let fields = term.match_fields.iter().flatten();
    if term.match_expressions.as_ref().is_none_or(Vec::is_empty)
        && term.match_fields.as_ref().is_none_or(Vec::is_empty)
    {
        // An empty term matches nothing.
        return false;
    }
    expressions.clone().all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
        && fields.clone().all(|r| r.key == "metadata.name" && requirement_matches(r, Some(node.name)))
}

fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let number = |text: &str| text.parse::<i64>().ok();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v > x)
        }
        "Lt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v < x)
        }
        _ => false,
    }
}

/// Whether a port the pod wants is held already: the same protocol and port on the same
/// address, or on every address (`0.0.0.0`) on either side.
fn ports_taken(share: &Share, others: &[Share]) -> bool {
    let any = |ip: &str| ip == "0.0.0.0" || ip.is_empty();
    share.host_ports.iter().any(|(protocol, ip, port)| {
        others
            .iter()
            .flat_map(|o| o.host_ports.iter())
            .any(|(p, i, n)| p == protocol && n == port && (i == ip || any(i) || any(ip)))
    })
}

/// A NoExecute taint of the node that none of the pod's tolerations tolerates.
fn untolerated_no_execute(spec: &PodSpec, taints: &[Taint]) -> bool {
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    taints.iter().filter(|t| t.effect == "NoExecute").any(|taint| {
        !tolerations.iter().any(|t| {
            let effect_ok = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == taint.effect);
            let key_ok =
                t.key.as_deref().is_none_or(|k| k.is_empty()) || t.key.as_deref() == Some(&taint.key);
            let value_ok = match t.operator.as_deref() {
                Some("Exists") => true,
                _ => t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default(),
            };
            effect_ok && key_ok && value_ok
        })
    })
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
