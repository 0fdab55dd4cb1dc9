//! The example pods and their objects as a real kube-apiserver returns them (defaults filled in: an unset downwardAPI divisor comes back as "0") want the same of the node as the same manifests read standalone (env-gated: `KVOL_KUBE_APISERVER`, `KVOL_ETCD`).

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use kube::Api;
use kvol_cluster::source::ApiSource;
use kvol_node::desired::pods::{NodeContext, desired_state_on};
use kvol_node::model::{DesiredState, ObjectSet};
use kvol_node::sources::ObjectSource;

use support::{ApiServer, until};

const NODE: &str = "n1";

/// Each pod volume as `pod/volume` → what the node wants of it: pending with the reason, or
/// the files it is to hold (contents, modes) — what a defaulted field would change.
fn wants(state: &DesiredState) -> BTreeMap<String, String> {
    state
        .volumes
        .values()
        .map(|v| {
            let what = match (&v.pending, &v.projection) {
                (Some(reason), _) => format!("pending: {reason}"),
                (None, Some(projection)) => format!("holds {:?}", projection.files),
                (None, None) => "set up by its plugin".to_string(),
            };
            (format!("{}/{}", v.pod_name, v.key.volume), what)
        })
        .collect()
}

/// `object` as the API server takes it: no uid (the standalone source made one up), no
/// resourceVersion, and a pod bound to the test's node.
fn for_the_api<K: serde::Serialize>(object: &K) -> serde_json::Value {
    let mut value = serde_json::to_value(object).expect("serialisable");
    let meta = value["metadata"].as_object_mut().expect("metadata");
    meta.remove("uid");
    meta.remove("resourceVersion");
    if value.get("spec").is_some_and(|s| s.get("containers").is_some()) {
        value["spec"]["nodeName"] = serde_json::json!(NODE);
    }
    value
}

async fn create_all<K>(api: &Api<K>, objects: impl Iterator<Item = K>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    for object in objects {
        support::create(api, for_the_api(&object)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_pods_want_the_same_from_the_api_server_as_from_their_manifests() {
    let Some((apiserver, etcd)) = support::binaries() else { return };
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agent");
    let standalone = kvol_node::sources::parse::load_dir(&examples);
    assert!(standalone.problems.is_empty(), "{:?}", standalone.problems);
    let server = ApiServer::start(&apiserver, &etcd);
    let client = server.client().await;
    create_all(
        &Api::<ConfigMap>::namespaced(client.clone(), "default"),
        standalone.config_maps.values().cloned(),
    )
    .await;
    create_all(&Api::<Secret>::namespaced(client.clone(), "default"), standalone.secrets.values().cloned())
        .await;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    create_all(&claims, standalone.claims.values().cloned()).await;
    let volumes = Api::<PersistentVolume>::all(client.clone());
    create_all(&volumes, standalone.persistent_volumes.values().map(|v| (**v).clone())).await;
    create_all(
        &Api::<Pod>::namespaced(client.clone(), "default"),
        standalone.pods.values().map(|p| (**p).clone()),
    )
    .await;

    let source = ApiSource::start(client.clone(), NODE).await;
    let complete = |set: &ObjectSet| {
        set.pods.len() == standalone.pods.len()
            && set.config_maps.len() >= standalone.config_maps.len()
            && set.secrets.len() >= standalone.secrets.len()
            && set.claims.len() >= standalone.claims.len()
            && set.persistent_volumes.len() >= standalone.persistent_volumes.len()
    };
    until(&source, "every example pod and the objects they reference", complete).await;
    let from_api = source.current();
    // What the API server filled in, for the record: the defaulted divisor is why this test exists.
    let pod = &from_api.pods["default/pod-objects"];
    let divisor = pod.spec.as_ref().and_then(|s| s.volumes.as_ref()).into_iter().flatten().find_map(|v| {
        v.downward_api
            .as_ref()?
            .items
            .as_ref()?
            .iter()
            .find_map(|i| i.resource_field_ref.as_ref()?.divisor.clone())
    });
    assert_eq!(divisor.map(|d| d.0), Some("0".to_string()), "the API server fills an unset divisor with 0");

    let node = NodeContext { node_name: NODE.to_string(), ..NodeContext::default() };
    let (standalone_wants, api_wants) =
        (wants(&desired_state_on(&standalone, &node)), wants(&desired_state_on(&from_api, &node)));
    assert!(!api_wants.is_empty());
    // The claims of the examples are not bound in either (the standalone control plane binds
    // them later, a cluster's provisioner elsewhere): their reasons name the same thing.
    let differences: Vec<String> = standalone_wants
        .iter()
        .filter(|(key, want)| api_wants.get(*key) != Some(want))
        .map(|(key, want)| format!("{key}:\n  standalone: {want}\n  api server: {:?}", api_wants.get(key)))
        .collect();
    assert!(
        differences.is_empty(),
        "the node wants something else of the API server's pods:\n{}",
        differences.join("\n")
    );
}
