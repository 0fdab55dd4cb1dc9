//! The ConfigMaps and Secrets a node's pods reference, followed by watch, against a real kube-apiserver (env-gated: `KVOL_KUBE_APISERVER`, `KVOL_ETCD`).

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use kvol_cluster::source::ApiSource;
use kvol_node::model::ObjectSet;
use kvol_node::sources::ObjectSource;
use serde_json::{Value, json};

use support::{ApiServer, create, until};

/// How soon a change must be in the set, from the moment the test asks the API server for it.
const PROMPT: Duration = Duration::from_secs(1);

fn keys<V>(map: &BTreeMap<String, V>) -> Vec<&str> {
    map.keys().map(String::as_str).collect()
}

/// The value of `key` in ConfigMap `default/name`, as the set holds it.
fn config_value<'a>(set: &'a ObjectSet, name: &str, key: &str) -> Option<&'a str> {
    set.config_maps.get(&format!("default/{name}"))?.data.as_ref()?.get(key).map(String::as_str)
}

/// The value of `key` in Secret `default/name`, as the set holds it.
fn secret_value<'a>(set: &'a ObjectSet, name: &str, key: &str) -> Option<&'a [u8]> {
    set.secrets.get(&format!("default/{name}"))?.data.as_ref()?.get(key).map(|b| b.0.as_slice())
}

async fn pod(client: &Client, name: &str, node: &str, volumes: Value) {
    create(
        &Api::<Pod>::namespaced(client.clone(), "default"),
        kvol_test_support::pods::mounting_its_volumes(
            json!({"metadata": {"name": name}, "spec": {"nodeName": node,
            "containers": [{"name": "c", "image": "none"}], "volumes": volumes}}),
        ),
    )
    .await;
}

async fn delete_pod(client: &Client, name: &str) {
    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    Api::<Pod>::namespaced(client.clone(), "default").delete(name, &now).await.expect("pod deleted");
}

/// Merge-patches ConfigMap `default/name`.
async fn patch(api: &Api<ConfigMap>, name: &str, body: Value) {
    api.patch(name, &PatchParams::default(), &Patch::Merge(&body)).await.expect("patched");
}

/// Sorted durations as milliseconds, for the record.
fn summary(mut latencies: Vec<Duration>) -> String {
    latencies.sort();
    let ms: Vec<String> = latencies.iter().map(|d| format!("{:.1}", d.as_secs_f64() * 1000.0)).collect();
    format!("{} ms", ms.join(", "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn referenced_config_maps_and_secrets_are_in_the_first_set_and_their_changes_within_a_second() {
    let Some((apiserver, etcd)) = support::binaries() else { return };
    let server = ApiServer::start(&apiserver, &etcd);
    let client = server.client().await;
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let secrets = Api::<Secret>::namespaced(client.clone(), "default");
    create(&config_maps, json!({"metadata": {"name": "settings"}, "data": {"k": "v0"}})).await;
    create(&config_maps, json!({"metadata": {"name": "bundle"}, "data": {"ca.crt": "pem"}})).await;
    create(&config_maps, json!({"metadata": {"name": "elsewhere"}, "data": {"k": "x"}})).await;
    create(&secrets, json!({"metadata": {"name": "creds"}, "stringData": {"password": "s0"}})).await;
    let direct = json!([{"name": "settings", "configMap": {"name": "settings"}},
                        {"name": "creds", "secret": {"secretName": "creds"}}]);
    pod(&client, "direct", "n1", direct).await;
    let projected = json!([{"name": "all", "projected": {"sources": [
        {"configMap": {"name": "settings"}}, {"configMap": {"name": "bundle"}},
        {"secret": {"name": "creds"}}, {"downwardAPI": {"items": []}}]}}]);
    pod(&client, "projected", "n1", projected).await;
    pod(&client, "theirs", "n2", json!([{"name": "c", "configMap": {"name": "elsewhere"}}])).await;

    let source = ApiSource::start(client.clone(), "n1").await;
    let first = source.current();
    assert_eq!(keys(&first.config_maps), ["default/bundle", "default/settings"], "only what n1's pods use");
    assert_eq!(keys(&first.secrets), ["default/creds"]);
    assert_eq!(config_value(&first, "settings", "k"), Some("v0"));
    assert_eq!(secret_value(&first, "creds", "password"), Some(&b"s0"[..]));
    assert_eq!(source.traffic().object_watches, 3, "one watch per object: {:?}", source.traffic());

    // Changes, timed from the request that makes them to the set that holds them.
    let mut latencies = Vec::new();
    for i in 1..=10 {
        let value = format!("v{i}");
        let asked = Instant::now();
        patch(&config_maps, "settings", json!({"data": {"k": value}})).await;
        until(&source, "the changed configmap", |s| config_value(s, "settings", "k") == Some(&value)).await;
        latencies.push(asked.elapsed());
    }
    let asked = Instant::now();
    let secret_patch = json!({"stringData": {"password": "s1"}});
    secrets.patch("creds", &PatchParams::default(), &Patch::Merge(&secret_patch)).await.expect("patched");
    until(&source, "the changed secret", |s| secret_value(s, "creds", "password") == Some(&b"s1"[..])).await;
    let secret_latency = asked.elapsed();
    println!(
        "a change in the set after: configmap {} (10 updates); secret {:.1} ms",
        summary(latencies.clone()),
        secret_latency.as_secs_f64() * 1000.0
    );
    assert!(latencies.iter().chain([&secret_latency]).all(|d| *d < PROMPT), "slower than {PROMPT:?}");

    // Deleted: gone from the set; still referenced, so still watched, and back when made again.
    config_maps.delete("bundle", &DeleteParams::default()).await.expect("deleted");
    until(&source, "the deleted configmap gone", |s| !s.config_maps.contains_key("default/bundle")).await;
    assert_eq!(source.traffic().object_watches, 3);
    create(&config_maps, json!({"metadata": {"name": "bundle"}, "data": {"ca.crt": "pem2"}})).await;
    until(&source, "the configmap made again", |s| config_value(s, "bundle", "ca.crt") == Some("pem2")).await;

    // The pods go: an object's watch stops with its last referrer, and the object leaves the set.
    delete_pod(&client, "projected").await;
    until(&source, "one pod left", |s| s.pods.len() == 1).await;
    let set = source.current();
    assert_eq!(keys(&set.config_maps), ["default/settings"]);
    assert_eq!(keys(&set.secrets), ["default/creds"]);
    assert_eq!(source.traffic().object_watches, 2, "{:?}", source.traffic());
    delete_pod(&client, "direct").await;
    until(&source, "no pods", |s| s.pods.is_empty()).await;
    let set = source.current();
    assert!(set.config_maps.is_empty() && set.secrets.is_empty(), "{set:?}");
    let traffic = source.traffic();
    assert_eq!((traffic.object_watches, traffic.object_watches_started), (0, 3), "{traffic:?}");
    Box::new(source).shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_sharing_a_config_map_share_one_watch_and_an_immutable_one_is_not_watched() {
    let Some((apiserver, etcd)) = support::binaries() else { return };
    let server = ApiServer::start(&apiserver, &etcd);
    let client = server.client().await;
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    create(&config_maps, json!({"metadata": {"name": "shared"}, "data": {"k": "v0"}})).await;
    let source = ApiSource::start(client.clone(), "n1").await;
    assert_eq!(source.traffic().object_watches, 0);

    // 50 pods arrive, half using the ConfigMap directly, half through a projected volume.
    const PODS: usize = 50;
    futures::stream::iter(0..PODS)
        .for_each_concurrent(16, |i| {
            let client = client.clone();
            async move {
                let volumes = if i % 2 == 0 {
                    json!([{"name": "c", "configMap": {"name": "shared"}}])
                } else {
                    json!([{"name": "p", "projected": {"sources": [{"configMap": {"name": "shared"}}]}}])
                };
                pod(&client, &format!("web-{i}"), "n1", volumes).await;
            }
        })
        .await;
    until(&source, "the 50 pods", |s| s.pods.len() == PODS).await;
    assert_eq!(config_value(&source.current(), "shared", "k"), Some("v0"));
    let traffic = source.traffic();
    assert_eq!((traffic.object_watches, traffic.object_watches_started), (1, 1), "{traffic:?}");

    // Immutable from the start: in the set, never watched past its first list; deleting it
    // from the API leaves the copy (as the kubelet keeps it).
    create(&config_maps, json!({"metadata": {"name": "frozen"}, "immutable": true, "data": {"k": "ice"}}))
        .await;
    pod(&client, "icy", "n1", json!([{"name": "c", "configMap": {"name": "frozen"}}])).await;
    until(&source, "the immutable configmap", |s| config_value(s, "frozen", "k") == Some("ice")).await;
    let traffic = source.traffic();
    assert_eq!((traffic.object_watches, traffic.object_watches_started), (1, 2), "{traffic:?}");
    config_maps.delete("frozen", &DeleteParams::default()).await.expect("deleted");
    // A change made after the deletion is seen, and the deletion was not.
    patch(&config_maps, "shared", json!({"data": {"k": "v1"}})).await;
    until(&source, "the shared configmap changed", |s| config_value(s, "shared", "k") == Some("v1")).await;
    assert_eq!(config_value(&source.current(), "frozen", "k"), Some("ice"));

    // Made immutable: its watch stops, its last content stays.
    patch(&config_maps, "shared", json!({"immutable": true, "data": {"k": "last"}})).await;
    until(&source, "the shared configmap immutable", |s| config_value(s, "shared", "k") == Some("last"))
        .await;
    assert_eq!(source.traffic().object_watches, 0, "{:?}", source.traffic());

    // The sharing pods go: the object leaves the set; the icy pod keeps its copy.
    futures::stream::iter(0..PODS)
        .for_each_concurrent(16, |i| {
            let client = client.clone();
            async move { delete_pod(&client, &format!("web-{i}")).await }
        })
        .await;
    until(&source, "only the icy pod", |s| s.pods.len() == 1).await;
    assert_eq!(keys(&source.current().config_maps), ["default/frozen"]);
    delete_pod(&client, "icy").await;
    until(&source, "no pods", |s| s.pods.is_empty()).await;
    assert!(source.current().config_maps.is_empty());
    let traffic = source.traffic();
    assert_eq!((traffic.object_watches, traffic.object_watches_started), (0, 2), "{traffic:?}");
    Box::new(source).shutdown();
}

/// A kubeconfig like `server`'s, authenticating with `token` instead of the admin's.
fn kubeconfig_with_token(server: &ApiServer, token: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(&server.kubeconfig).unwrap();
    let start = text.find("token: ").expect("the admin kubeconfig has a token");
    let end = text[start..].find('\n').map_or(text.len(), |n| start + n);
    let path = server.dir.path().join("restricted.kubeconfig");
    std::fs::write(&path, format!("{}token: {token}{}", &text[..start], &text[end..])).unwrap();
    path
}

/// The ClusterRole of deploy/cluster/kvol.yaml, as shipped.
fn deployed_role() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/cluster/kvol.yaml");
    let docs = kvol_node::sources::parse_values(&std::fs::read_to_string(path).unwrap()).unwrap();
    docs.into_iter().find(|d| d["kind"] == "ClusterRole").expect("a ClusterRole")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployed_role_reads_secrets_by_name_where_it_may_not_watch_them() {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let Some((apiserver, etcd)) = support::binaries() else { return };
    let server = ApiServer::start(&apiserver, &etcd);
    let admin = server.client().await;
    create(&Api::<ClusterRole>::all(admin.clone()), deployed_role()).await;
    create(
        &Api::<ServiceAccount>::namespaced(admin.clone(), "default"),
        json!({"metadata": {"name": "kvol"}}),
    )
    .await;
    create(
        &Api::<ClusterRoleBinding>::all(admin.clone()),
        json!({"metadata": {"name": "kvol-node"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kvol-node"},
               "subjects": [{"kind": "ServiceAccount", "name": "kvol", "namespace": "default"}]}),
    )
    .await;
    let accounts = Api::<ServiceAccount>::namespaced(admin.clone(), "default");
    let request: TokenRequest = serde_json::from_value(json!({"spec": {"audiences": []}})).unwrap();
    let minted = accounts.create_token_request("kvol", &Default::default(), &request).await.expect("a token");
    let token = minted.status.and_then(|s| s.token).expect("a token");
    let restricted =
        kvol_cluster::client::client(Some(&kubeconfig_with_token(&server, &token))).await.expect("a client");

    create(
        &Api::<ConfigMap>::namespaced(admin.clone(), "default"),
        json!({"metadata": {"name": "cfg"}, "data": {"k": "v"}}),
    )
    .await;
    create(
        &Api::<Secret>::namespaced(admin.clone(), "default"),
        json!({"metadata": {"name": "creds"}, "stringData": {"p": "s"}}),
    )
    .await;
    pod(&admin, "p", "n1", json!([{"name": "c", "configMap": {"name": "cfg"}}, {"name": "s", "secret": {"secretName": "creds"}}]))
        .await;

    let source = ApiSource::start(restricted, "n1").await;
    let set = source.current();
    assert_eq!(keys(&set.pods), ["default/p"], "the role lists the node's pods");
    assert_eq!(config_value(&set, "cfg", "k"), Some("v"), "the role watches ConfigMaps");
    assert_eq!(
        secret_value(&set, "creds", "p"),
        Some(&b"s"[..]),
        "a Secret the role may not watch is read by name"
    );
    let traffic = source.traffic();
    assert!(traffic.reads >= 1, "{traffic:?}");
    // The ConfigMap, watched, still follows a change within a second.
    let asked = Instant::now();
    patch(&Api::<ConfigMap>::namespaced(admin.clone(), "default"), "cfg", json!({"data": {"k": "w"}})).await;
    until(&source, "the changed configmap", |set| config_value(set, "cfg", "k") == Some("w")).await;
    let took = asked.elapsed();
    eprintln!("with the deployed role: a ConfigMap change in the set after {took:?}");
    assert!(took < PROMPT, "slower than {PROMPT:?}");
    Box::new(source).shutdown();
}
