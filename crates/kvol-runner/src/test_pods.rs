//! Pods for the runner's table tests: one place for the fixture the decision tests share.

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

/// Pod `shop/web` (uid `u-1`) with `restartPolicy` `policy` and busybox containers of the names given.
pub fn pod(policy: &str, init: &[&str], containers: &[&str]) -> Pod {
    let list =
        |names: &[&str]| names.iter().map(|n| json!({"name": n, "image": "busybox"})).collect::<Vec<_>>();
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
        "spec": {"restartPolicy": policy, "initContainers": list(init), "containers": list(containers)}
    }))
    .unwrap()
}
