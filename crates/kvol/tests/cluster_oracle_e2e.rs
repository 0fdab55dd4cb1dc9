//! The real kubelet v1.26 as the oracle of what a node writes to the API: in one cluster (kube-apiserver and etcd, kube-controller-manager, kube-scheduler), the kvol node `kvol-node` and the kubelet node `kubelet-node`, each on its own containerd with a CNI bridge network, each given the same pod (a configMap, a secret, a downwardAPI and an emptyDir volume beside kube-api-access, an init container, a server ready by its probe, a container that exits once and is restarted). Compared field by field as the API server returns them: the pod's status, the Node, and the Events about the pod (through its deletion), with the fields that carry times, ids, addresses, versions and node names taken aside.
//!
//! Every difference is printed. The test fails on any difference [`KNOWN`] does not list
//! (each entry with its reason), so whatever matches now stays matched. Needs root and the
//! peers of `. /work/peers/env.sh` (`KVOL_KUBE_APISERVER`, `KVOL_ETCD`,
//! `KVOL_KUBE_CONTROLLER_MANAGER`, `KVOL_KUBE_SCHEDULER`, `KVOL_KUBELET`, `KVOL_CNI_BIN`),
//! containerd, runc and a static busybox; skipped, saying which, without them.

#[path = "../../kvol-cluster/tests/support/mod.rs"]
mod cluster;
#[path = "support/control_plane.rs"]
mod control_plane;
#[path = "support/side_by_side.rs"]
mod side_by_side;
#[allow(dead_code)]
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use serde_json::{Value, json};
use side_by_side::{KUBELET_NODE, KVOL_NODE, SideBySide};
use support::cluster_node::until;
use support::containerd::IMAGE;

/// The differences kvol's writes keep from kubelet's, by path (`*` stands for any text), each
/// with its reason.
const KNOWN: &[(&str, &str)] = &[
    ("status/images (count)", "kvol does not list the node's images (status.images)"),
    (
        "status/nodeInfo/systemUUID",
        "without /sys/class/dmi/id/product_uuid kvol leaves it empty; kubelet's cAdvisor finds an id elsewhere (here the machine-id)",
    ),
    ("events[*]/source.component", "kvol reports its Events as the component kvol, not kubelet"),
    (
        "events[*]/reportingComponent",
        "kvol names itself in reportingComponent; kubelet's recorder leaves it empty",
    ),
    (
        "events[Warning Unhealthy * \"Readiness probe errored: *",
        "kubelet at times probes a container it is stopping (its task gone); kvol wrote no such Event in these runs",
    ),
    (
        "events[Warning MissingClusterDNS *",
        "with no cluster DNS both fall back to the host's resolv.conf, but kvol writes no MissingClusterDNS Event",
    ),
];

/// What a path's value is compared as: as it is, only whether it is there, or not at all.
#[derive(Clone, Copy, PartialEq)]
enum Aside {
    Value,
    Presence,
}

/// Paths whose values are times, ids, addresses or versions: only their presence compares.
const PRESENCE: &[&str] = &[
    "lastTransitionTime",
    "lastProbeTime",
    "lastHeartbeatTime",
    "startTime",
    "startedAt",
    "finishedAt",
    "containerID",
    "imageID",
    "hostIP",
    "podIP",
    "podIPs",
    "address",
    "kubeletVersion",
    "kubeProxyVersion",
    "Port",
];

/// How the value at `path` compares: by its last segment (an array element's key aside).
fn aside(path: &str) -> Aside {
    let last = path.rsplit('/').next().unwrap_or(path);
    let last = last.split('[').next().unwrap_or(last);
    if PRESENCE.contains(&last) { Aside::Presence } else { Aside::Value }
}

/// An array element's key: its name, type or reason, else its index.
fn element_key(element: &Value, index: usize) -> String {
    ["name", "type", "reason"]
        .iter()
        .find_map(|k| element.get(*k).and_then(Value::as_str))
        .map(str::to_string)
        .unwrap_or_else(|| index.to_string())
}

/// Every leaf of `value` by path (`a/b[key]/c`), names of pods and nodes written
/// `<pod>` and `<node>`, the values of [`PRESENCE`] paths written `<set>`.
fn flatten(value: &Value, path: &str, names: &[(&str, &str)], out: &mut BTreeMap<String, String>) {
    let leaf = |v: &Value| {
        let text = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let text = if aside(path) == Aside::Presence { "<set>".to_string() } else { text };
        names.iter().fold(text, |t, (name, placeholder)| t.replace(name, placeholder))
    };
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, v) in map {
                flatten(v, &format!("{path}/{key}"), names, out);
            }
        }
        Value::Array(items) if !items.is_empty() && aside(path) == Aside::Value => {
            for (i, v) in items.iter().enumerate() {
                flatten(v, &format!("{path}[{}]", element_key(v, i)), names, out);
            }
        }
        other => {
            out.insert(path.to_string(), leaf(other));
        }
    }
}

/// One path whose value differs between the two nodes' writes.
struct Difference {
    path: String,
    kvol: Option<String>,
    kubelet: Option<String>,
}

fn differences(kvol: &BTreeMap<String, String>, kubelet: &BTreeMap<String, String>) -> Vec<Difference> {
    let paths: std::collections::BTreeSet<&String> = kvol.keys().chain(kubelet.keys()).collect();
    paths
        .into_iter()
        .filter(|p| kvol.get(*p) != kubelet.get(*p))
        .map(|p| Difference { path: p.clone(), kvol: kvol.get(p).cloned(), kubelet: kubelet.get(p).cloned() })
        .collect()
}

/// The entry of [`KNOWN`] that explains the difference at `path`.
fn known(path: &str) -> Option<&'static str> {
    KNOWN.iter().find(|(pattern, _)| matches(pattern, path)).map(|(_, reason)| *reason)
}

/// Whether `path` matches `pattern`, whose `*` stands for any text.
fn matches(pattern: &str, path: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = path.strip_prefix(first) else { return false };
    let mut parts: Vec<&str> = parts.collect();
    let Some(last) = parts.pop() else { return rest.is_empty() };
    for part in parts {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// The pod given to `node` as `name`: an init container writes into the emptyDir; `web`
/// serves what it read of the configMap, secret and downwardAPI volumes, ready by an httpGet
/// probe; `once` exits 3 on its first run and sleeps on its second.
fn pod(name: &str, node: &str) -> Value {
    let scratch = json!({"name": "scratch", "mountPath": "/scratch"});
    let container = |name: &str, script: &str| {
        json!({"name": name, "image": IMAGE, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", script], "volumeMounts": [scratch]})
    };
    let mut spec = control_plane::web_pod_spec();
    spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    spec["initContainers"] = json!([container("setup", "echo set up > /scratch/setup")]);
    // An exec probe of the file the server serves, written before it starts: no probe fails
    // while the pod runs (an httpGet of a server being stopped is refused, an Event kubelet
    // may write on deletion; an exec into a stopped container errs, a difference listed).
    spec["containers"][0]["readinessProbe"] =
        json!({"exec": {"command": ["cat", "/scratch/said"]}, "initialDelaySeconds": 1, "periodSeconds": 1});
    let once = "if [ -e /scratch/ran ]; then exec sleep 3600; fi; touch /scratch/ran; exit 3";
    spec["containers"].as_array_mut().unwrap().push(container("once", once));
    json!({"metadata": {"name": name, "labels": {"app": "oracle"}}, "spec": spec})
}

/// The pod's name on `node`.
fn pod_name(node: &str) -> String {
    format!("oracle-{}", node.trim_end_matches("-node"))
}

/// The names a node's writes carry, and what they are written as in the comparison.
fn names(node: &str) -> Vec<(String, &'static str)> {
    vec![(pod_name(node), "<pod>"), (node.to_string(), "<node>")]
}

/// Waits until the pod on `node` is Ready, `once` restarted once and running again, and the
/// status has stayed so for 3 s; the pod then.
async fn settled(cluster: &SideBySide, node: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    let name = pod_name(node);
    let what = format!("pod {name} ready on {node} with its container `once` restarted once");
    let mut stable_since: Option<(std::time::Instant, String)> = None;
    until(&what, Duration::from_secs(180), &cluster.log_of(node), async || {
        let pod = pods.get(&name).await.ok()?;
        let status = pod.status.clone()?;
        let ready = status.conditions.as_ref()?.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        let once = status.container_statuses.as_ref()?.iter().find(|c| c.name == "once")?.clone();
        let restarted = once.restart_count == 1 && once.state.as_ref()?.running.is_some();
        if !(ready && restarted) {
            stable_since = None;
            return None;
        }
        let version = pod.metadata.resource_version.clone().unwrap_or_default();
        match &stable_since {
            Some((since, seen)) if *seen == version => {
                (since.elapsed() > Duration::from_secs(3)).then_some(pod)
            }
            _ => {
                stable_since = Some((std::time::Instant::now(), version));
                None
            }
        }
    })
    .await
}

/// The pod's status, flattened.
fn pod_fields(pod: &Pod, node: &str) -> BTreeMap<String, String> {
    let names = names(node);
    let names: Vec<(&str, &str)> = names.iter().map(|(n, p)| (n.as_str(), *p)).collect();
    let mut out = BTreeMap::new();
    flatten(&serde_json::to_value(pod.status.as_ref()).unwrap(), "status", &names, &mut out);
    out
}

/// The Node's labels, annotations, spec and status, flattened; the status's images (the
/// runtimes' own, which differ) by count alone.
fn node_fields(node: &Node) -> BTreeMap<String, String> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let names = [(name.as_str(), "<node>")];
    let mut value = serde_json::to_value(node).unwrap();
    let mut out = BTreeMap::new();
    if let Some(images) = value["status"].as_object_mut().and_then(|s| s.remove("images")) {
        out.insert("status/images (count)".into(), images.as_array().map_or(0, Vec::len).to_string());
    }
    flatten(&value["metadata"]["labels"], "metadata/labels", &names, &mut out);
    flatten(&value["metadata"]["annotations"], "metadata/annotations", &names, &mut out);
    flatten(&value["spec"], "spec", &names, &mut out);
    flatten(&value["status"], "status", &names, &mut out);
    // Capacity and allocatable by key: their values are the node's own (reservations, thresholds).
    out.retain(|path, _| !path.starts_with("status/allocatable/"));
    for key in node.status.as_ref().and_then(|s| s.allocatable.as_ref()).into_iter().flatten().map(|(k, _)| k)
    {
        out.insert(format!("status/allocatable/{key}"), "<set>".into());
    }
    out
}

/// The Events about the pod on `node`, by type, reason, object field and message (names
/// normalised): their count and source.
async fn event_fields(cluster: &SideBySide, node: &str) -> BTreeMap<String, String> {
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), "default");
    let selector = format!("involvedObject.name={}", pod_name(node));
    let listed = events.list(&ListParams::default().fields(&selector)).await.expect("the events listed");
    let mut out = BTreeMap::new();
    for event in listed.items.into_iter().filter(by_node_or_scheduler) {
        let uid = event.involved_object.uid.clone().unwrap_or_default();
        let normal = |text: &str| {
            let named = names(node)
                .iter()
                .fold(text.to_string(), |t, (name, placeholder)| t.replace(name, placeholder));
            if uid.is_empty() { named } else { named.replace(&uid, "<uid>") }
        };
        let key = format!(
            "events[{} {} {} {:?}]",
            event.type_.unwrap_or_default(),
            event.reason.unwrap_or_default(),
            event.involved_object.field_path.unwrap_or_default(),
            normal(&event.message.unwrap_or_default())
        );
        let source = event.source.unwrap_or_default();
        out.insert(format!("{key}/count"), event.count.unwrap_or(1).to_string());
        out.insert(format!("{key}/source.component"), source.component.unwrap_or_default());
        out.insert(format!("{key}/source.host"), normal(&source.host.unwrap_or_default()));
        out.insert(format!("{key}/reportingComponent"), event.reporting_component.unwrap_or_default());
    }
    out
}

/// Whether the Event is a node agent's (kubelet's, kvol's) or the scheduler's: the controllers'
/// (the taint manager's, say, when a loaded node's status comes late) are no node's writes.
fn by_node_or_scheduler(event: &Event) -> bool {
    let component = event.source.as_ref().and_then(|s| s.component.as_deref()).unwrap_or_default();
    ["kubelet", "kvol", "default-scheduler"].contains(&component)
}

/// Prints the differences of one part, marked known (with the reason) or new; the new ones.
fn report(part: &str, found: Vec<Difference>, all: &mut Vec<String>) -> Vec<String> {
    let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(absent)".into());
    all.extend(found.iter().map(|d| d.path.clone()));
    let mut new = Vec::new();
    eprintln!("\n{part}: {} differences", found.len());
    for d in found {
        let line = format!("{}: kvol {} | kubelet {}", d.path, show(&d.kvol), show(&d.kubelet));
        match known(&d.path) {
            Some(reason) => eprintln!("  known  {line}  ({reason})"),
            None => {
                eprintln!("  NEW    {line}");
                new.push(format!("{part}: {line}"));
            }
        }
    }
    new
}

#[test]
fn a_pod_its_node_and_its_events_as_kubelet_writes_them() {
    if let Some(why) = side_by_side::missing_peer() {
        return eprintln!("skipped: {why}");
    }
    support::enter_private_mount_namespace();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cluster = SideBySide::start(&runtime);
    let new = runtime.block_on(compare(&cluster));
    assert!(
        new.is_empty(),
        "differences from kubelet's writes that KNOWN does not list:\n{}",
        new.join("\n")
    );
}

#[test]
fn known_patterns_match_as_said() {
    assert!(matches("events[*]/source.component", "events[Normal Created x \"m\"]/source.component"));
    assert!(!matches("events[*]/source.component", "events[Normal Created x \"m\"]/count"));
    assert!(matches("status/images (count)", "status/images (count)"));
    assert!(!matches("status/images (count)", "status/images (count)/more"));
    assert!(matches(
        "events[Warning MissingClusterDNS *",
        "events[Warning MissingClusterDNS  \"pod\"]/count"
    ));
}

/// Both pods run, compared, deleted; the Node and the Events compared; the new differences.
async fn compare(cluster: &SideBySide) -> Vec<String> {
    control_plane::create_app_config(&cluster.client).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    for node in [KVOL_NODE, KUBELET_NODE] {
        control_plane::create(&pods, pod(&pod_name(node), node)).await;
    }
    let kvol_pod = settled(cluster, KVOL_NODE).await;
    let kubelet_pod = settled(cluster, KUBELET_NODE).await;
    let mut paths = Vec::new();
    let mut new = report(
        "pod status",
        differences(&pod_fields(&kvol_pod, KVOL_NODE), &pod_fields(&kubelet_pod, KUBELET_NODE)),
        &mut paths,
    );
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let (kvol_node, kubelet_node) =
        (nodes.get(KVOL_NODE).await.unwrap(), nodes.get(KUBELET_NODE).await.unwrap());
    new.extend(report(
        "node",
        differences(&node_fields(&kvol_node), &node_fields(&kubelet_node)),
        &mut paths,
    ));
    for node in [KVOL_NODE, KUBELET_NODE] {
        deleted(cluster, node).await;
    }
    let (kvol_events, kubelet_events) =
        (event_fields(cluster, KVOL_NODE).await, event_fields(cluster, KUBELET_NODE).await);
    new.extend(report("events", differences(&kvol_events, &kubelet_events), &mut paths));
    unmatched_known(&paths);
    new
}

/// Says which entries of [`KNOWN`] matched no difference of `paths`: kvol may have caught up.
fn unmatched_known(paths: &[String]) {
    for (pattern, reason) in KNOWN {
        if !paths.iter().any(|p| matches(pattern, p)) {
            eprintln!("known difference not found this time (fixed? then drop it): {pattern} ({reason})");
        }
    }
}

/// The pod on `node` deleted (as `kubectl delete`), waited for until gone from the API.
async fn deleted(cluster: &SideBySide, node: &str) {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    let name = pod_name(node);
    pods.delete(&name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("cannot delete {name}: {e}"));
    let what = format!("pod {name} gone from {node}");
    until(&what, Duration::from_secs(120), &cluster.log_of(node), async || {
        pods.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
}
