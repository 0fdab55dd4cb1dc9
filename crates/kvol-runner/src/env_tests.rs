use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::json;

use super::*;

fn objects() -> ObjectSet {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "settings", "namespace": "shop"},
        "data": {"colour": "blue", "size": "9", "bad key": "x", "1digit": "y"}
    }))
    .unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "creds", "namespace": "shop"}, "stringData": {"password": "hunter2"}
    }))
    .unwrap();
    let mut set = ObjectSet::default();
    set.config_maps.insert("shop/settings".into(), cm);
    set.secrets.insert("shop/creds".into(), secret);
    set
}

fn pod(container: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "shop", "uid": "u-1", "labels": {"app": "web"}},
        "spec": {"nodeName": "n1", "containers": [container]}
    }))
    .unwrap()
}

fn run(container: serde_json::Value) -> Result<Vec<(String, String)>, String> {
    let pod = pod(container);
    let objects = objects();
    let context = EnvContext {
        objects: &objects,
        node_name: "n1",
        host_ip: "192.0.2.1",
        pod_ip: "10.1.0.5",
        node: NodeResources { cpu_millis: 4000, memory_bytes: 8 << 30, ephemeral_storage_bytes: 1 << 40 },
    };
    environment(&pod, &pod.spec.as_ref().unwrap().containers[0], &context)
}

fn vars(pairs: &[(&str, &str)]) -> Result<Vec<(String, String)>, String> {
    Ok(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

#[test]
fn environment_table() {
    type Vars = Result<Vec<(String, String)>, String>;
    let cases: Vec<(&str, serde_json::Value, Vars)> = vec![
        (
            "values expand earlier ones; unknown stays",
            json!({"env": [{"name": "A", "value": "x"}, {"name": "B", "value": "$(A)-$(NOPE)-$$(A)"}]}),
            vars(&[("A", "x"), ("B", "x-$(NOPE)-$(A)")]),
        ),
        (
            "fields",
            json!({"env": [{"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "L", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}}]}),
            vars(&[("N", "web"), ("L", "web"), ("NODE", "n1"), ("IP", "10.1.0.5"), ("SA", "default")]),
        ),
        (
            "resources: limit, the node's when unset, request defaulting to the limit",
            json!({"resources": {"limits": {"memory": "64Mi"}},
                "env": [{"name": "M", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                {"name": "C", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                {"name": "R", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory"}}}]}),
            vars(&[("M", "64"), ("C", "4"), ("R", "67108864")]),
        ),
        (
            "configMap and secret keys",
            json!({"env": [{"name": "COLOUR", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "colour"}}},
                {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}}]}),
            vars(&[("COLOUR", "blue"), ("PW", "hunter2")]),
        ),
        (
            "optional missing key and object are skipped",
            json!({"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "nope", "optional": true}}},
                {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k", "optional": true}}}]}),
            vars(&[]),
        ),
        (
            "missing configMap key",
            json!({"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "nope"}}}]}),
            Err("couldn't find key nope in ConfigMap shop/settings".into()),
        ),
        (
            "missing secret key",
            json!({"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nope"}}}]}),
            Err("couldn't find key nope in Secret shop/creds".into()),
        ),
        (
            "missing configMap",
            json!({"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k"}}}]}),
            Err("couldn't get configMap shop/gone: configmap \"gone\" not found".into()),
        ),
        (
            "envFrom with a prefix; invalid names skipped; env wins in place",
            json!({"envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CM_"}, {"secretRef": {"name": "creds"}}],
                "env": [{"name": "CM_size", "value": "10"}]}),
            vars(&[("CM_1digit", "y"), ("CM_colour", "blue"), ("CM_size", "10"), ("password", "hunter2")]),
        ),
        (
            "envFrom optional missing",
            json!({"envFrom": [{"configMapRef": {"name": "gone", "optional": true}}]}),
            vars(&[]),
        ),
        (
            "envFrom missing secret",
            json!({"envFrom": [{"secretRef": {"name": "gone"}}]}),
            Err("couldn't get secret shop/gone: secret \"gone\" not found".into()),
        ),
    ];
    for (name, mut container, want) in cases {
        container["name"] = json!("c");
        assert_eq!(run(container), want, "{name}");
    }
}

#[test]
fn env_var_names() {
    for (name, ok) in
        [("A_b.c-d", true), ("_x", true), ("1x", false), ("bad key", false), ("", false), ("é", false)]
    {
        assert_eq!(is_env_var_name(name), ok, "{name}");
    }
}
