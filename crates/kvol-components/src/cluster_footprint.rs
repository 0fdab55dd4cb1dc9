//! What a component costs in a cluster, read from its deployed objects: how many of each kind, each workload's readiness and what its pods request, and the volumes of its driver; no I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolume;
use serde::Serialize;
use serde_json::Value;

use crate::bundle::ObjectRef;
use crate::definition::ComponentDefinition;

/// One component's footprint in the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterFootprint {
    pub component: String,
    /// How many deployed objects of each kind carry the component's label.
    pub objects: BTreeMap<String, usize>,
    pub workloads: Vec<WorkloadFootprint>,
    /// PersistentVolumes of the component's CSI driver; `None` for a component without one.
    pub volumes: Option<usize>,
}

/// A DaemonSet, Deployment or StatefulSet of the component.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadFootprint {
    /// `Kind namespace/name`.
    pub workload: String,
    pub ready: i64,
    pub desired: i64,
    /// What each of its pods requests, container by container.
    pub requests: Vec<ContainerRequests>,
}

/// One container's resource requests (as written; absent when it requests nothing).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRequests {
    pub container: String,
    pub cpu: Option<String>,
    pub memory: Option<String>,
}

/// The footprint of `component` from its deployed objects (each with the API's copy) and the
/// cluster's PersistentVolumes.
pub fn footprint(
    component: &ComponentDefinition,
    deployed: &[(ObjectRef, Value)],
    volumes: &[PersistentVolume],
) -> ClusterFootprint {
    let mut out = ClusterFootprint { component: component.name.clone(), ..ClusterFootprint::default() };
    for (reference, object) in deployed {
        *out.objects.entry(reference.kind.clone()).or_default() += 1;
        if let Some(workload) = workload(reference, object) {
            out.workloads.push(workload);
        }
    }
    if let Some(driver) = component.provides.csi_driver.as_deref() {
        out.volumes = Some(
            volumes
                .iter()
                .filter(|pv| {
                    pv.spec.as_ref().and_then(|s| s.csi.as_ref()).is_some_and(|csi| csi.driver == driver)
                })
                .count(),
        );
    }
    out
}

fn workload(reference: &ObjectRef, object: &Value) -> Option<WorkloadFootprint> {
    let number = |pointer: &str| object.pointer(pointer).and_then(Value::as_i64);
    let (ready, desired) = match reference.kind.as_str() {
        "DaemonSet" => (number("/status/numberReady"), number("/status/desiredNumberScheduled")),
        "Deployment" | "StatefulSet" => {
            (number("/status/readyReplicas"), number("/spec/replicas").or(Some(1)))
        }
        _ => return None,
    };
    let containers = object.pointer("/spec/template/spec/containers").and_then(Value::as_array);
    let requests = containers
        .into_iter()
        .flatten()
        .map(|c| {
            let request = |resource: &str| {
                c.pointer(&format!("/resources/requests/{resource}")).map(|q| match q {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
            };
            ContainerRequests {
                container: c.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
                cpu: request("cpu"),
                memory: request("memory"),
            }
        })
        .collect();
    Some(WorkloadFootprint {
        workload: reference.to_string(),
        ready: ready.unwrap_or(0),
        desired: desired.unwrap_or(0),
        requests,
    })
}

impl std::fmt::Display for ClusterFootprint {
    /// Lines for people: the objects, each workload with what its pods request, the volumes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let objects: Vec<String> = self.objects.iter().map(|(kind, n)| format!("{n} {kind}")).collect();
        match objects.as_slice() {
            [] => writeln!(f, "  objects: none deployed")?,
            _ => writeln!(f, "  objects: {}", objects.join(", "))?,
        }
        for workload in &self.workloads {
            let requests: Vec<String> = workload
                .requests
                .iter()
                .map(|r| match (&r.cpu, &r.memory) {
                    (None, None) => format!("{} nothing", r.container),
                    (cpu, memory) => format!(
                        "{} cpu {} memory {}",
                        r.container,
                        cpu.as_deref().unwrap_or("-"),
                        memory.as_deref().unwrap_or("-")
                    ),
                })
                .collect();
            writeln!(
                f,
                "  {}: {}/{} pods ready; each pod requests {}",
                workload.workload,
                workload.ready,
                workload.desired,
                requests.join(", ")
            )?;
        }
        match self.volumes {
            Some(count) => writeln!(f, "  volumes: {count}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reference(kind: &str, name: &str) -> ObjectRef {
        ObjectRef { api_version: "v1".into(), kind: kind.into(), namespace: "ns".into(), name: name.into() }
    }

    #[test]
    fn objects_workloads_and_volumes_are_counted_from_what_is_deployed() {
        let definition = ComponentDefinition::parse(
            "name: fast\nrole: driver\nprovides: {csiDriver: fast.csi.example}\n",
            "fast.yaml",
        )
        .unwrap();
        let daemonset = json!({"spec": {"template": {"spec": {"containers": [
                {"name": "driver", "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}}},
                {"name": "sidecar"}]}}},
            "status": {"numberReady": 2, "desiredNumberScheduled": 3}});
        let deployment = json!({"spec": {"template": {"spec": {"containers": [
                {"name": "c", "resources": {"requests": {"memory": "1Gi"}}}]}}}});
        let deployed = vec![
            (reference("DaemonSet", "node"), daemonset),
            (reference("Deployment", "controller"), deployment),
            (reference("ServiceAccount", "a"), json!({})),
            (reference("ServiceAccount", "b"), json!({})),
        ];
        let pv = |driver: &str| -> PersistentVolume {
            serde_json::from_value(
                json!({"metadata": {"name": "p"}, "spec": {"csi": {"driver": driver, "volumeHandle": "h"}}}),
            )
            .unwrap()
        };
        let volumes = [pv("fast.csi.example"), pv("other.csi.example"), pv("fast.csi.example")];
        let got = footprint(&definition, &deployed, &volumes);
        assert_eq!(
            got.objects,
            BTreeMap::from([("DaemonSet".into(), 1), ("Deployment".into(), 1), ("ServiceAccount".into(), 2)])
        );
        assert_eq!(got.volumes, Some(2));
        assert_eq!((got.workloads[0].ready, got.workloads[0].desired), (2, 3));
        assert_eq!(
            (got.workloads[1].ready, got.workloads[1].desired),
            (0, 1),
            "a Deployment with no status: 0 of its 1 replica"
        );
        let text = got.to_string();
        assert!(text.contains("DaemonSet ns/node: 2/3 pods ready; each pod requests driver cpu 10m memory 32Mi, sidecar nothing"), "{text}");
        assert!(
            text.contains("Deployment ns/controller: 0/1 pods ready; each pod requests c cpu - memory 1Gi"),
            "{text}"
        );
        assert!(
            text.contains("objects: 1 DaemonSet, 1 Deployment, 2 ServiceAccount")
                && text.contains("volumes: 2"),
            "{text}"
        );
    }
}
