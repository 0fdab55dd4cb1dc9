//! The Node as kubelet keeps it, for a kvol node that runs its own pods: its registration (labels, addresses, capacity, `nodeInfo`, conditions), its Lease in `kube-node-lease` renewed every 10 s, its status posted when it changes (and every 5 minutes) — and the refusal to act for a node another agent keeps.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use kvol_api::allocatable::pressure;
pub use kvol_api::allocatable::{Available, Eviction, Pressure};
use kvol_api::projection::NodeResources;
use serde_json::{Value, json};

/// The field manager of kvol's node registration, lease and node status (not [`crate::node_objects::FIELD_MANAGER`]:
/// an apply of one set of fields must not remove the other's).
pub const NODE_FIELD_MANAGER: &str = "kvol-node";
/// The namespace of nodes' Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// How long a Lease holds (kubelet's `nodeLeaseDurationSeconds`); it is renewed every quarter.
pub const LEASE_SECONDS: i32 = 40;
/// A status unchanged is posted again this often (kubelet's `nodeStatusReportFrequency`).
pub const STATUS_REPORT_EVERY: Duration = Duration::from_secs(300);

/// How often the node's conditions are looked at (kubelet's `nodeStatusUpdateFrequency`); a
/// change is posted at once.
pub const CONDITIONS_CHECKED_EVERY: Duration = Duration::from_secs(10);

/// What the node knows of itself, gathered by the binary (the host, the runtime).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFacts {
    pub name: String,
    pub hostname: String,
    pub internal_ip: String,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub ephemeral_storage_bytes: u64,
    pub max_pods: u32,
    /// `amd64`, `arm64`, … (Go's names).
    pub architecture: String,
    pub kernel_version: String,
    pub os_image: String,
    pub machine_id: String,
    pub system_uuid: String,
    pub boot_id: String,
    /// `<runtime>://<version>`, from CRI's Version.
    pub container_runtime_version: String,
    /// What kvol says in `nodeInfo.kubeletVersion` (and `kubeProxyVersion`).
    pub agent_version: String,
    /// Labels the node's drivers add (topology).
    pub extra_labels: BTreeMap<String, String>,
    /// The port kubelet's API is served on (`daemonEndpoints`); 0: not served.
    pub kubelet_port: u16,
    /// What the node's pods may have (capacity less reservations and eviction thresholds);
    /// none: the capacity.
    pub allocatable: Option<NodeResources>,
    /// How the node's pressure is measured.
    pub pressure: PressureWatch,
    /// Each huge page size the host has, as its resource (`hugepages-2Mi`), with the bytes of
    /// its pages (kubelet reports every size the machine supports, none reserved: `0`).
    pub hugepages: BTreeMap<String, u64>,
}

/// How the node's pressure is measured: what is available now, against the hard eviction
/// thresholds; without a measure there is never pressure.
#[derive(Clone, Default)]
pub struct PressureWatch {
    pub eviction: Eviction,
    pub measure: Option<Arc<dyn Fn() -> Available + Send + Sync>>,
}

impl std::fmt::Debug for PressureWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PressureWatch")
            .field("eviction", &self.eviction)
            .field("measured", &self.measure.is_some())
            .finish()
    }
}

impl PartialEq for PressureWatch {
    fn eq(&self, other: &PressureWatch) -> bool {
        self.eviction == other.eviction && self.measure.is_some() == other.measure.is_some()
    }
}

impl PressureWatch {
    /// The pressure now.
    pub fn now(&self) -> Pressure {
        self.measure.as_ref().map_or(Pressure::default(), |measure| pressure(&measure(), &self.eviction))
    }
}

/// The node's conditions and when each last changed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NodeConditions {
    pub pressure: Pressure,
    pub memory_since: Timestamp,
    pub disk_since: Timestamp,
    pub ready_since: Timestamp,
}

impl NodeConditions {
    /// Conditions first heard at `now`.
    pub fn new(pressure: Pressure, now: Timestamp) -> NodeConditions {
        NodeConditions { pressure, memory_since: now, disk_since: now, ready_since: now }
    }

    /// Takes the pressure measured at `now`; whether a condition changed (its transition time
    /// is then `now`).
    pub fn update(&mut self, pressure: Pressure, now: Timestamp) -> bool {
        if pressure.memory != self.pressure.memory {
            self.memory_since = now;
        }
        if pressure.disk != self.pressure.disk {
            self.disk_since = now;
        }
        let changed = pressure != self.pressure;
        self.pressure = pressure;
        changed
    }
}

/// A quantity of bytes as kubelet writes it (a `BinarySI` quantity, canonical): the largest
/// binary suffix that divides it exactly (`24683772Ki`, `1Gi`), else the plain number.
pub fn binary_si(bytes: u64) -> String {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes == 0 {
        return "0".into();
    }
    let (mut value, mut suffix) = (bytes, "");
    for next in SUFFIXES {
        if value % 1024 != 0 {
            break;
        }
        (value, suffix) = (value / 1024, next);
    }
    format!("{value}{suffix}")
}

/// kubelet's well-known labels of a node (and their `beta.` forms).
pub fn well_known_labels(hostname: &str, architecture: &str) -> BTreeMap<String, String> {
    [
        ("kubernetes.io/hostname", hostname),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", architecture),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", architecture),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// kvol's fields of the Node object: the well-known labels and the drivers' topology.
pub fn node_body(facts: &NodeFacts) -> Value {
    let mut labels = well_known_labels(&facts.hostname, &facts.architecture);
    labels.extend(facts.extra_labels.clone());
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": facts.name, "labels": labels}})
}

/// kvol's fields of the Node's status: addresses, capacity and allocatable, `nodeInfo`, and
/// the four conditions with kubelet's reasons, heard at `now`.
pub fn node_status_body(facts: &NodeFacts, conditions: &NodeConditions, now: Timestamp) -> Value {
    let resources = |r: NodeResources| {
        let mut resources = json!({
            "cpu": format!("{}m", r.cpu_millis),
            "memory": binary_si(r.memory_bytes),
            "pods": format!("{}", facts.max_pods),
            "ephemeral-storage": binary_si(r.ephemeral_storage_bytes),
        });
        for (name, bytes) in &facts.hugepages {
            resources[name] = json!(binary_si(*bytes));
        }
        resources
    };
    let capacity = NodeResources {
        cpu_millis: facts.cpu_millis,
        memory_bytes: facts.memory_bytes,
        ephemeral_storage_bytes: facts.ephemeral_storage_bytes,
    };
    let condition = |kind: &str, (status, reason, message): (&str, &str, &str), since: Timestamp| {
        json!({"type": kind, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now.to_string(), "lastTransitionTime": since.to_string()})
    };
    let memory = if conditions.pressure.memory {
        ("True", "KubeletHasInsufficientMemory", "kubelet has insufficient memory available")
    } else {
        ("False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available")
    };
    let disk = if conditions.pressure.disk {
        ("True", "KubeletHasDiskPressure", "kubelet has disk pressure")
    } else {
        ("False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure")
    };
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": facts.name}, "status": {
        "addresses": [{"type": "InternalIP", "address": facts.internal_ip}, {"type": "Hostname", "address": facts.hostname}],
        "capacity": resources(capacity), "allocatable": resources(facts.allocatable.unwrap_or(capacity)),
        "nodeInfo": {
            "machineID": facts.machine_id, "systemUUID": facts.system_uuid, "bootID": facts.boot_id,
            "kernelVersion": facts.kernel_version, "osImage": facts.os_image,
            "containerRuntimeVersion": facts.container_runtime_version,
            "kubeletVersion": facts.agent_version, "kubeProxyVersion": facts.agent_version,
            "operatingSystem": "linux", "architecture": facts.architecture,
        },
        "daemonEndpoints": {"kubeletEndpoint": {"Port": facts.kubelet_port}},
        "conditions": [
            condition("MemoryPressure", memory, conditions.memory_since),
            condition("DiskPressure", disk, conditions.disk_since),
            condition("PIDPressure", ("False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"), conditions.ready_since),
            condition("Ready", ("True", "KubeletReady", "kubelet is posting ready status"), conditions.ready_since),
        ],
    }})
}

/// The node's Lease, held by the node and owned by its Node (so it goes with it).
/// `renewTime` is a MicroTime: written with microseconds.
pub fn lease_body(node: &str, node_uid: &str, now: Timestamp) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": node, "namespace": LEASE_NAMESPACE,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": MicroTime(now)}})
}

/// Whether kvol may act for the node: not while its Lease is renewed by another agent (a
/// kubelet, anything but kvol's field manager) and has not run out; the refusal says who and
/// since when.
pub fn judge_lease(node: &str, lease: Option<&Lease>, now: Timestamp) -> Result<(), String> {
    let Some(lease) = lease else { return Ok(()) };
    let Some(renewed) = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()).map(|t| t.0) else {
        return Ok(());
    };
    let duration = lease.spec.as_ref().and_then(|s| s.lease_duration_seconds).unwrap_or(LEASE_SECONDS);
    let age = now.duration_since(renewed).as_secs();
    let renewer = renewal_manager(lease).unwrap_or_else(|| "an unknown agent".to_string());
    if age >= i64::from(duration) || renewer == NODE_FIELD_MANAGER {
        return Ok(());
    }
    Err(format!(
        "node {node} is kept by another agent: its lease {LEASE_NAMESPACE}/{node} was renewed by {renewer:?} {age}s ago \
         (it holds {duration}s); kvol does not act beside a kubelet: stop that agent, or give kvol another --node-name"
    ))
}

/// The field manager that last set the Lease's `spec.renewTime`.
fn renewal_manager(lease: &Lease) -> Option<String> {
    let entries = lease.metadata.managed_fields.as_ref()?;
    let owns_renew = |fields: &Value| fields.pointer("/f:spec/f:renewTime").is_some();
    entries
        .iter()
        .filter(|e| e.fields_v1.as_ref().is_some_and(|f| owns_renew(&f.0)))
        .max_by_key(|e| e.time.as_ref().map(|t| t.0))
        .and_then(|e| e.manager.clone())
}

fn apply() -> PatchParams {
    PatchParams::apply(NODE_FIELD_MANAGER).force()
}

/// Takes the node for kvol: refused while another agent keeps it; with `facts` (kvol runs the
/// node's pods) the Node is registered and kept, without them only checked.
pub async fn take_node(
    client: Client,
    node: &str,
    facts: Option<NodeFacts>,
) -> Result<Option<NodeKeeper>, String> {
    match facts {
        Some(facts) => NodeKeeper::start(client, facts).await.map(Some),
        None => {
            let leases: Api<Lease> = Api::namespaced(client, LEASE_NAMESPACE);
            let lease =
                leases.get_opt(node).await.map_err(|e| format!("cannot read lease of node {node}: {e}"))?;
            judge_lease(node, lease.as_ref(), Timestamp::now()).map(|()| None)
        }
    }
}

/// The registered node: its Lease renewed and its status posted until [`NodeKeeper::stop`].
#[derive(Debug)]
pub struct NodeKeeper {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl NodeKeeper {
    /// Refuses a node another agent keeps; otherwise registers the Node (labels, status),
    /// takes its Lease, and keeps both.
    pub async fn start(client: Client, facts: NodeFacts) -> Result<NodeKeeper, String> {
        let name = facts.name.clone();
        let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
        let lease =
            leases.get_opt(&name).await.map_err(|e| format!("cannot read lease of node {name}: {e}"))?;
        judge_lease(&name, lease.as_ref(), Timestamp::now())?;
        let nodes: Api<Node> = Api::all(client.clone());
        let registered = nodes
            .patch(&name, &apply(), &Patch::Apply(node_body(&facts)))
            .await
            .map_err(|e| format!("cannot register node {name}: {e}"))?;
        let uid = registered.metadata.uid.unwrap_or_default();
        // The Lease first: a node says Ready only with its heartbeat in place.
        renew(&leases, &name, &uid).await?;
        let conditions = NodeConditions::new(facts.pressure.now(), Timestamp::now());
        nodes
            .patch_status(
                &name,
                &apply(),
                &Patch::Apply(node_status_body(&facts, &conditions, Timestamp::now())),
            )
            .await
            .map_err(|e| format!("cannot post the status of node {name}: {e}"))?;
        tracing::info!(node = %name, "node registered; its lease is renewed every {}s", LEASE_SECONDS / 4);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(keep(nodes, leases, facts, conditions, uid, stopped));
        Ok(NodeKeeper { stop, task })
    }

    /// Stops renewing: the node lifecycle controller marks the node NotReady once the Lease runs out.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn renew(leases: &Api<Lease>, node: &str, uid: &str) -> Result<(), String> {
    leases
        .patch(node, &apply(), &Patch::Apply(lease_body(node, uid, Timestamp::now())))
        .await
        .map(|_| ())
        .map_err(|e| format!("cannot renew the lease of node {node}: {e}"))
}

/// The loop: the Lease every quarter of its duration (the node's heartbeat), the conditions
/// looked at every [`CONDITIONS_CHECKED_EVERY`] and the status posted when they change, and
/// every [`STATUS_REPORT_EVERY`] anyway (kubelet posts an unchanged status that often).
async fn keep(
    nodes: Api<Node>,
    leases: Api<Lease>,
    facts: NodeFacts,
    mut conditions: NodeConditions,
    uid: String,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let renew_every = Duration::from_secs((LEASE_SECONDS / 4) as u64);
    let start = tokio::time::Instant::now();
    let (mut next_renew, mut next_report) = (start + renew_every, start + STATUS_REPORT_EVERY);
    let mut next_check = start + CONDITIONS_CHECKED_EVERY;
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            _ = tokio::time::sleep_until(next_renew.min(next_report).min(next_check)) => {}
        }
        let now = tokio::time::Instant::now();
        if now >= next_check {
            next_check = now + CONDITIONS_CHECKED_EVERY;
            let pressure = facts.pressure.now();
            if conditions.update(pressure, Timestamp::now()) {
                tracing::warn!(node = %facts.name, memory_pressure = pressure.memory, disk_pressure = pressure.disk, "node conditions changed");
                next_report = now;
            }
        }
        if now >= next_renew {
            next_renew = match renew(&leases, &facts.name, &uid).await {
                Ok(()) => now + renew_every,
                Err(why) => {
                    tracing::warn!(node = %facts.name, %why, "lease not renewed; trying again in 1 s");
                    now + Duration::from_secs(1)
                }
            };
        }
        if now >= next_report {
            let body = node_status_body(&facts, &conditions, Timestamp::now());
            if let Err(e) = nodes.patch_status(&facts.name, &apply(), &Patch::Apply(body)).await {
                tracing::warn!(node = %facts.name, error = %e, "node status not posted");
            }
            next_report = now + STATUS_REPORT_EVERY;
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, Time};

    use super::*;

    fn lease(renewed_secs_ago: i64, manager: &str) -> Lease {
        let now = Timestamp::from_second(1_000_000).unwrap();
        let renewed = now.checked_sub(jiff_seconds(renewed_secs_ago)).unwrap();
        let mut lease: Lease =
            serde_json::from_value(json!({"metadata": {"name": "n1", "namespace": LEASE_NAMESPACE},
            "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40}}))
            .unwrap();
        lease.spec.as_mut().unwrap().renew_time = Some(MicroTime(renewed));
        lease.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some(manager.to_string()),
            operation: Some("Update".into()),
            fields_v1: Some(FieldsV1(json!({"f:spec": {"f:renewTime": {}, "f:holderIdentity": {}}}))),
            time: Some(Time(renewed)),
            ..Default::default()
        }]);
        lease
    }

    fn jiff_seconds(s: i64) -> k8s_openapi::jiff::SignedDuration {
        k8s_openapi::jiff::SignedDuration::from_secs(s)
    }

    #[test]
    fn a_node_kept_by_another_agent_is_refused() {
        let now = Timestamp::from_second(1_000_000).unwrap();
        // (case, lease, allowed)
        let cases = [
            ("no lease: a new node", None, true),
            ("a kubelet renewed it 3 s ago", Some(lease(3, "kubelet")), false),
            ("a kubelet's lease ran out 50 s ago", Some(lease(50, "kubelet")), true),
            ("kvol's own, from before a restart", Some(lease(3, NODE_FIELD_MANAGER)), true),
        ];
        for (name, lease, allowed) in cases {
            let got = judge_lease("n1", lease.as_ref(), now);
            assert_eq!(got.is_ok(), allowed, "{name}: {got:?}");
        }
        let refusal = judge_lease("n1", Some(&lease(3, "kubelet")), now).unwrap_err();
        assert!(refusal.starts_with("node n1 is kept by another agent: its lease kube-node-lease/n1 was renewed by \"kubelet\" 3s ago"), "{refusal}");
    }

    #[test]
    fn a_condition_keeps_its_transition_time_until_it_changes() {
        let at = |s: i64| Timestamp::from_second(s).unwrap();
        let mut conditions = NodeConditions::new(Pressure::default(), at(10));
        assert!(!conditions.update(Pressure::default(), at(20)), "unchanged");
        assert_eq!((conditions.memory_since, conditions.disk_since), (at(10), at(10)));
        assert!(conditions.update(Pressure { memory: true, disk: false }, at(30)));
        assert_eq!((conditions.memory_since, conditions.disk_since), (at(30), at(10)));
        let facts = NodeFacts {
            name: "n1".into(),
            cpu_millis: 2000,
            memory_bytes: 4 << 30,
            ephemeral_storage_bytes: 100 << 30,
            allocatable: Some(NodeResources {
                cpu_millis: 1700,
                memory_bytes: 3 << 30,
                ephemeral_storage_bytes: 90 << 30,
            }),
            ..Default::default()
        };
        let body = node_status_body(&facts, &conditions, at(40));
        let status = serde_json::from_value::<Node>(body).unwrap().status.unwrap();
        assert_eq!(status.allocatable.as_ref().unwrap()["cpu"].0, "1700m");
        assert_eq!(status.capacity.as_ref().unwrap()["cpu"].0, "2000m");
        let memory = status.conditions.unwrap().into_iter().find(|c| c.type_ == "MemoryPressure").unwrap();
        assert_eq!(
            (memory.status.as_str(), memory.reason.as_deref(), memory.last_transition_time.map(|t| t.0)),
            ("True", Some("KubeletHasInsufficientMemory"), Some(at(30)))
        );
    }

    #[test]
    fn bytes_as_kubelet_writes_them() {
        let cases = [(0, "0"), (512, "512"), (1024, "1Ki"), (25_276_182_528, "24683772Ki"), (3 << 30, "3Gi")];
        for (bytes, want) in cases {
            assert_eq!(binary_si(bytes), want, "{bytes}");
        }
    }

    #[test]
    fn the_node_as_kubelet_registers_it() {
        let facts = NodeFacts {
            name: "n1".into(),
            hostname: "host-1".into(),
            internal_ip: "192.0.2.7".into(),
            cpu_millis: 2000,
            memory_bytes: 1 << 30,
            ephemeral_storage_bytes: 10 << 30,
            max_pods: 110,
            architecture: "amd64".into(),
            container_runtime_version: "containerd://1.6.20".into(),
            agent_version: "kvol/0.1.0".into(),
            hugepages: [("hugepages-2Mi".to_string(), 0)].into(),
            ..Default::default()
        };
        let node = node_body(&facts);
        assert_eq!(node["metadata"]["labels"]["kubernetes.io/hostname"], "host-1");
        assert_eq!(node["metadata"]["labels"]["beta.kubernetes.io/arch"], "amd64");
        let heard = Timestamp::from_second(1_000_000).unwrap();
        let status = node_status_body(&facts, &NodeConditions::new(Pressure::default(), heard), heard);
        let parsed: Node = serde_json::from_value(status.clone()).expect("a Node the API accepts");
        let st = parsed.status.unwrap();
        assert_eq!(st.capacity.as_ref().unwrap()["cpu"].0, "2000m");
        assert_eq!(st.allocatable.as_ref().unwrap()["pods"].0, "110");
        let capacity = st.capacity.as_ref().unwrap();
        assert_eq!(
            (capacity["memory"].0.as_str(), capacity["ephemeral-storage"].0.as_str()),
            ("1Gi", "10Gi"),
            "bytes as kubelet's BinarySI quantities"
        );
        assert_eq!(capacity["hugepages-2Mi"].0, "0");
        let ready = st.conditions.unwrap().into_iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_deref()), ("True", Some("KubeletReady")));
        assert_eq!(st.node_info.unwrap().container_runtime_version, "containerd://1.6.20");
        let lease: Lease =
            serde_json::from_value(lease_body("n1", "uid-1", Timestamp::from_second(5).unwrap())).unwrap();
        assert_eq!(lease.spec.unwrap().lease_duration_seconds, Some(40));
        assert_eq!(lease.metadata.owner_references.unwrap()[0].uid, "uid-1");
    }
}
