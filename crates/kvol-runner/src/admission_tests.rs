//! Admission as kubelet admits: one table of pods against one node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Taint};
use kvol_api::projection::NodeResources;
use serde_json::json;

use super::*;

fn pod(spec: serde_json::Value) -> Pod {
    let mut spec = spec;
    if spec.get("containers").is_none() {
        spec["containers"] = json!([{"name": "main", "image": "busybox"}]);
    }
    serde_json::from_value(
        json!({"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": spec}),
    )
    .unwrap()
}

/// A row: what, the pod's spec, the other pods' shares, and the outcome (admitted, or the
/// reason and message).
type Row = (&'static str, serde_json::Value, Vec<Share>, Result<(), (&'static str, &'static str)>);

fn requesting(cpu: &str, memory: &str) -> serde_json::Value {
    json!({"containers": [{"name": "main", "image": "busybox",
        "resources": {"requests": {"cpu": cpu, "memory": memory}}}]})
}

#[test]
fn pods_admitted_or_refused_with_kubelets_reasons() {
    let labels: BTreeMap<String, String> = [("kubernetes.io/hostname", "n1"), ("disk", "ssd"), ("rack", "7")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let taints = vec![
        Taint { key: "gone".into(), effect: "NoExecute".into(), value: Some("yes".into()), time_added: None },
        // The scheduler's to judge, not kubelet's admission: no row is refused by it.
        Taint { key: "busy".into(), effect: "NoSchedule".into(), value: None, time_added: None },
        Taint { key: "spare".into(), effect: "PreferNoSchedule".into(), value: None, time_added: None },
    ];
    let node = NodeView {
        name: "n1",
        labels: &labels,
        allocatable: NodeResources {
            cpu_millis: 2000,
            memory_bytes: 1 << 30,
            ephemeral_storage_bytes: 1 << 34,
        },
        max_pods: 3,
        taints: &taints,
    };
    let tolerate = json!([{"key": "gone", "operator": "Exists", "effect": "NoExecute"}]);
    let busy = Share { cpu_millis: 1500, memory_bytes: 1 << 29, ..Default::default() };
    let port_holder =
        Share { host_ports: vec![("TCP".into(), "0.0.0.0".into(), 8080)], ..Default::default() };
    let affinity = |op: &str, values: serde_json::Value| {
        json!({"tolerations": tolerate, "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": op, "values": values}]}]}}}})
    };
    let with_tolerations = |mut spec: serde_json::Value| {
        spec["tolerations"] = tolerate.clone();
        spec
    };
    // (what, pod spec, other pods, outcome: Ok or (reason, message))
    let table: Vec<Row> = vec![
        ("fits", with_tolerations(requesting("500m", "100Mi")), vec![busy.clone()], Ok(())),
        (
            "too much cpu beside another",
            with_tolerations(requesting("600m", "1Mi")),
            vec![busy.clone()],
            Err((
                "OutOfcpu",
                "Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000",
            )),
        ),
        (
            "too much memory",
            with_tolerations(requesting("1m", "2Gi")),
            vec![],
            Err((
                "OutOfmemory",
                "Node didn't have enough resource: memory, requested: 2147483648, used: 0, capacity: 1073741824",
            )),
        ),
        (
            "no room for a fourth pod",
            with_tolerations(json!({})),
            vec![Share::default(), Share::default(), Share::default()],
            Err(("OutOfpods", "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3")),
        ),
        (
            "requests nothing beside a full node",
            with_tolerations(json!({})),
            vec![busy.clone(), busy.clone()],
            Ok(()),
        ),
        (
            "an init container's request counts when larger",
            with_tolerations(json!({"initContainers": [{"name": "init", "image": "busybox",
                "resources": {"limits": {"cpu": "3"}}}], "containers": [{"name": "main", "image": "busybox"}]})),
            vec![],
            Err((
                "OutOfcpu",
                "Node didn't have enough resource: cpu, requested: 3000, used: 0, capacity: 2000",
            )),
        ),
        ("nodeSelector matched", with_tolerations(json!({"nodeSelector": {"disk": "ssd"}})), vec![], Ok(())),
        (
            "nodeSelector not matched",
            with_tolerations(json!({"nodeSelector": {"disk": "hdd"}})),
            vec![],
            Err(("NodeAffinity", "Predicate NodeAffinity failed")),
        ),
        ("affinity In", affinity("In", json!(["6", "7"])), vec![], Ok(())),
        (
            "affinity NotIn",
            affinity("NotIn", json!(["7"])),
            vec![],
            Err(("NodeAffinity", "Predicate NodeAffinity failed")),
        ),
        ("affinity Gt", affinity("Gt", json!(["6"])), vec![], Ok(())),
        (
            "affinity Lt",
            affinity("Lt", json!(["6"])),
            vec![],
            Err(("NodeAffinity", "Predicate NodeAffinity failed")),
        ),
        (
            "affinity on the node's name",
            with_tolerations(
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]},
                                      {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}),
            ),
            vec![],
            Ok(()),
        ),
        (
            "a host port another pod holds",
            with_tolerations(json!({"containers": [{"name": "main", "image": "busybox",
                "ports": [{"containerPort": 80, "hostPort": 8080}]}]})),
            vec![port_holder.clone()],
            Err(("NodePorts", "Predicate NodePorts failed")),
        ),
        (
            "the same port over UDP",
            with_tolerations(json!({"containers": [{"name": "main", "image": "busybox",
                "ports": [{"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}]}]})),
            vec![port_holder],
            Ok(()),
        ),
        (
            "a NoExecute taint not tolerated",
            json!({}),
            vec![],
            Err(("TaintToleration", "Predicate TaintToleration failed")),
        ),
        (
            "a toleration of another value",
            json!({"tolerations": [{"key": "gone", "operator": "Equal", "value": "no", "effect": "NoExecute"}]}),
            vec![],
            Err(("TaintToleration", "Predicate TaintToleration failed")),
        ),
        (
            "tolerating the key with the NoSchedule effect only",
            json!({"tolerations": [{"key": "gone", "operator": "Exists", "effect": "NoSchedule"}]}),
            vec![],
            Err(("TaintToleration", "Predicate TaintToleration failed")),
        ),
        (
            "the NoExecute taint tolerated, the NoSchedule one not: admitted (kubelet judges NoExecute only)",
            json!({"tolerations": tolerate}),
            vec![],
            Ok(()),
        ),
        (
            "tolerated by an empty key and Exists",
            json!({"tolerations": [{"operator": "Exists"}]}),
            vec![],
            Ok(()),
        ),
    ];
    for (what, spec, others, outcome) in table {
        let got = admit(&pod(spec), &node, &others).map(|_| ()).map_err(|r| (r.reason, r.message));
        let want = outcome.map_err(|(r, m)| (r.to_string(), m.to_string()));
        assert_eq!(got, want, "{what}");
    }
}

#[test]
fn a_static_pod_is_not_held_to_the_taints() {
    let labels = BTreeMap::new();
    let taints =
        vec![Taint { key: "gone".into(), effect: "NoExecute".into(), value: None, time_added: None }];
    let node = NodeView {
        name: "n1",
        labels: &labels,
        allocatable: NodeResources::default(),
        max_pods: 10,
        taints: &taints,
    };
    let mut static_pod = pod(json!({}));
    static_pod.metadata.annotations =
        Some([("kubernetes.io/config.source".to_string(), "file".to_string())].into());
    assert_eq!(admit(&static_pod, &node, &[]).map(|_| ()), Ok(()));
    assert!(admit(&pod(json!({})), &node, &[]).is_err());
}
