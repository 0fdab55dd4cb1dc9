//! Pod manifests for tests: a container that uses every volume of its pod, since kvol (as kubelet) sets up only the volumes some container mounts or maps.

use serde_json::{Value, json};

/// The `volumeMounts` of a container that mounts each of `volumes` (pod volumes as JSON) at
/// `/volumes/<name>`.
pub fn mounts_of(volumes: &Value) -> Value {
    let names = volumes.as_array().into_iter().flatten().filter_map(|v| v["name"].as_str());
    Value::Array(names.map(|name| json!({"name": name, "mountPath": format!("/volumes/{name}")})).collect())
}

/// `pod` (a Pod as JSON) with its first container mounting each of the pod's volumes at
/// `/volumes/<name>`.
pub fn mounting_its_volumes(mut pod: Value) -> Value {
    let mounts = mounts_of(&pod["spec"]["volumes"]);
    pod["spec"]["containers"][0]["volumeMounts"] = mounts;
    pod
}

/// A pod manifest's `containers` value, as one line of flow-style YAML: one container `name`
/// (image `busybox`) mounting each volume of `volumes_yaml` (a YAML list of pod volumes, as
/// under `volumes:`) at `/volumes/<name>`.
pub fn containers_using(name: &str, volumes_yaml: &str) -> String {
    let volumes: Value = serde_saphyr::from_str(volumes_yaml).expect("the test's volumes are a YAML list");
    json!([{"name": name, "image": "busybox", "volumeMounts": mounts_of(&volumes)}]).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_volume_is_mounted_once_by_its_name() {
        let yaml = "  - {name: a, emptyDir: {}}\n  - name: b\n    hostPath: {path: /x}\n";
        let containers: Value = serde_json::from_str(&containers_using("app", yaml)).unwrap();
        let mounts = &containers[0]["volumeMounts"];
        assert_eq!(
            mounts,
            &json!([{"name": "a", "mountPath": "/volumes/a"}, {"name": "b", "mountPath": "/volumes/b"}])
        );
        assert_eq!(containers[0]["name"], "app");
        assert_eq!(mounts_of(&json!([])), json!([]));
        let pod =
            json!({"spec": {"containers": [{"name": "c"}], "volumes": [{"name": "v", "emptyDir": {}}]}});
        assert_eq!(
            mounting_its_volumes(pod)["spec"]["containers"][0]["volumeMounts"],
            json!([{"name": "v", "mountPath": "/volumes/v"}])
        );
    }
}
