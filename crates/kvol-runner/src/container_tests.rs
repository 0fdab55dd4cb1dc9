use kvol_api::ObjectSet;
use kvol_api::projection::NodeResources;
use serde_json::json;

use super::*;

fn pod(spec: serde_json::Value) -> Pod {
    serde_json::from_value(
        json!({"metadata": {"name": "web", "namespace": "shop", "uid": "u-1"}, "spec": spec}),
    )
    .unwrap()
}

fn config_of(
    pod: &Pod,
    restart_count: u32,
    mounts: &rt::ContainerMountsResponse,
) -> Result<cri::ContainerConfig, String> {
    let objects = ObjectSet::default();
    let context = ContainerContext {
        env: EnvContext {
            objects: &objects,
            node_name: "n1",
            host_ip: "192.0.2.1",
            pod_ip: "",
            node: NodeResources { cpu_millis: 2000, memory_bytes: 1 << 30, ephemeral_storage_bytes: 0 },
        },
        restart_count,
        mounts,
        termination_log: Some(Path::new("/var/lib/kvol/runner/containers/u-1/c/abc")),
        hosts_file: Some(Path::new("/var/lib/kvol/runner/pods/u-1/etc-hosts")),
        image_user: &ImageUser::default(),
    };
    container_config(pod, &pod.spec.as_ref().unwrap().containers[0], &context)
}

#[test]
fn command_env_mounts_labels_and_log() {
    let pod = pod(json!({"containers": [{"name": "c", "image": "busybox", "workingDir": "/work",
        "command": ["sh", "-c"], "args": ["echo $(GREETING) $(UNSET)"],
        "env": [{"name": "GREETING", "value": "hi"}]}]}));
    let mounts = rt::ContainerMountsResponse {
        mounts: vec![rt::Mount {
            container_path: "/data".into(),
            host_path: "/var/lib/kvol/pods/u-1/volumes/kubernetes.io~empty-dir/data".into(),
            readonly: true,
            selinux_relabel: true,
            propagation: rt::MountPropagation::PropagationHostToContainer as i32,
            volume: "data".into(),
            sub_path: String::new(),
        }],
        devices: vec![rt::Device {
            container_path: "/dev/xvda".into(),
            host_path: "/dev/loop3".into(),
            permissions: "mrw".into(),
            volume: "blk".into(),
        }],
    };
    let config = config_of(&pod, 4, &mounts).unwrap();
    assert_eq!(config.command, vec!["sh", "-c"]);
    assert_eq!(config.args, vec!["echo hi $(UNSET)"]);
    assert_eq!(config.working_dir, "/work");
    assert_eq!(config.envs, vec![cri::KeyValue { key: "GREETING".into(), value: "hi".into() }]);
    assert_eq!(config.log_path, "c/4.log");
    assert_eq!(config.metadata.as_ref().unwrap().attempt, 4);
    assert_eq!(config.annotations.get(labels::CONTAINER_RESTART_COUNT).map(String::as_str), Some("4"));
    assert_eq!(config.labels.get(labels::CONTAINER_NAME).map(String::as_str), Some("c"));
    let got: Vec<_> =
        config.mounts.iter().map(|m| (m.container_path.as_str(), m.readonly, m.propagation)).collect();
    assert_eq!(
        got,
        vec![
            ("/data", true, cri::MountPropagation::PropagationHostToContainer as i32),
            ("/dev/termination-log", false, cri::MountPropagation::PropagationPrivate as i32),
            ("/etc/hosts", false, cri::MountPropagation::PropagationPrivate as i32),
        ]
    );
    assert_eq!(config.devices[0].host_path, "/dev/loop3");
}

#[test]
fn a_missing_key_is_a_config_error() {
    let pod = pod(json!({"containers": [{"name": "c", "image": "busybox",
        "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "k"}}}]}]}));
    let err = config_of(&pod, 0, &Default::default()).unwrap_err();
    assert_eq!(err, "couldn't get configMap shop/settings: configmap \"settings\" not found");
}

#[test]
fn security_table() {
    // (case, pod securityContext, container securityContext, check)
    type Check = fn(&cri::LinuxContainerSecurityContext) -> bool;
    let cases: Vec<(&str, serde_json::Value, serde_json::Value, Check)> = vec![
        (
            "container user over the pod's",
            json!({"runAsUser": 1, "runAsGroup": 2}),
            json!({"runAsUser": 5}),
            |sc| {
                sc.run_as_user == Some(cri::Int64Value { value: 5 })
                    && sc.run_as_group == Some(cri::Int64Value { value: 2 })
            },
        ),
        (
            "fsGroup first among the groups",
            json!({"fsGroup": 7, "supplementalGroups": [8, 9]}),
            json!({}),
            |r| r.supplemental_groups == vec![7, 8, 9],
        ),
        (
            "read-only root, privileged",
            json!({}),
            json!({"readOnlyRootFilesystem": true, "privileged": true}),
            |sc| sc.readonly_rootfs && sc.privileged,
        ),
        ("capabilities", json!({}), json!({"capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}}), |r| {
            let caps = r.capabilities.clone().unwrap();
            caps.add_capabilities == vec!["NET_ADMIN"] && caps.drop_capabilities == vec!["ALL"]
        }),
        ("no escalation: no_new_privs", json!({}), json!({"allowPrivilegeEscalation": false}), |r| {
            r.no_new_privs
        }),
        ("escalation unset: privs allowed", json!({}), json!({}), |r| !r.no_new_privs),
        ("seccomp from the pod", json!({"seccompProfile": {"type": "RuntimeDefault"}}), json!({}), |r| {
            r.seccomp.as_ref().unwrap().profile_type
                == cri::security_profile::ProfileType::RuntimeDefault as i32
        }),
    ];
    for (name, pod_sc, container_sc, check) in cases {
        let pod = pod(json!({"securityContext": pod_sc,
            "containers": [{"name": "c", "image": "i", "securityContext": container_sc}]}));
        let spec = pod.spec.as_ref().unwrap();
        let got = effective_security(spec, &spec.containers[0]);
        assert!(check(&got), "{name}: {got:?}");
    }
}

#[test]
fn non_root_table() {
    let root = "container has runAsNonRoot and image will run as root (pod: \"web_shop(u-1)\", container: c)";
    let user_0 = "container's runAsUser breaks non-root policy (pod: \"web_shop(u-1)\", container: c)";
    let named = "container has runAsNonRoot and image has non-numeric user (nobody), cannot verify user is non-root (pod: \"web_shop(u-1)\", container: c)";
    let user = |uid: Option<i64>, name: &str| ImageUser { uid, username: name.into() };
    // (case, pod securityContext, container securityContext, image user, refusal)
    let cases = [
        ("no policy: root image runs", json!({}), json!({}), user(Some(0), ""), None),
        ("root image refused", json!({"runAsNonRoot": true}), json!({}), user(Some(0), ""), Some(root)),
        (
            "no user in the image is root",
            json!({}),
            json!({"runAsNonRoot": true}),
            user(None, ""),
            Some(root),
        ),
        ("image uid 1000 runs", json!({"runAsNonRoot": true}), json!({}), user(Some(1000), ""), None),
        (
            "a name cannot be checked",
            json!({"runAsNonRoot": true}),
            json!({}),
            user(None, "nobody"),
            Some(named),
        ),
        (
            "runAsUser 0 refused",
            json!({"runAsNonRoot": true}),
            json!({"runAsUser": 0}),
            user(Some(5), ""),
            Some(user_0),
        ),
        (
            "runAsUser decides over the image",
            json!({"runAsNonRoot": true, "runAsUser": 7}),
            json!({}),
            user(Some(0), ""),
            None,
        ),
        (
            "the container's false wins",
            json!({"runAsNonRoot": true}),
            json!({"runAsNonRoot": false}),
            user(Some(0), ""),
            None,
        ),
    ];
    for (name, pod_sc, container_sc, image, refusal) in cases {
        let pod = pod(json!({"securityContext": pod_sc,
            "containers": [{"name": "c", "image": "i", "securityContext": container_sc}]}));
        let got = verify_non_root(&pod, &pod.spec.as_ref().unwrap().containers[0], &image);
        assert_eq!(got.err().as_deref(), refusal, "{name}");
    }
}

#[test]
fn resources_table() {
    // (case, resources, shares, period, quota, memory, oom)
    let cases: Vec<(&str, serde_json::Value, i64, i64, i64, i64, i64)> = vec![
        ("best effort", json!({}), 2, 0, 0, 0, 1000),
        (
            "guaranteed",
            json!({"limits": {"cpu": "500m", "memory": "128Mi"}}),
            512,
            100_000,
            50_000,
            128 << 20,
            -997,
        ),
        (
            "burstable: quarter of the node's memory requested",
            json!({"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "1"}}),
            256,
            100_000,
            100_000,
            0,
            750,
        ),
        (
            "tiny limit: 1 ms quota, 2 shares",
            json!({"limits": {"cpu": "1m"}, "requests": {"cpu": "1m"}}),
            2,
            100_000,
            1000,
            0,
            999,
        ),
    ];
    for (name, resources, shares, period, quota, memory, oom) in cases {
        let pod = pod(json!({"containers": [{"name": "c", "image": "i", "resources": resources}]}));
        let got = linux_resources(&pod, &pod.spec.as_ref().unwrap().containers[0], 1 << 30);
        assert_eq!(
            (got.cpu_shares, got.cpu_period, got.cpu_quota, got.memory_limit_in_bytes, got.oom_score_adj),
            (shares, period, quota, memory, oom),
            "{name}"
        );
    }
}

#[test]
fn oom_score_bounds() {
    assert_eq!(oom_score_adj(QosClass::Burstable, 1 << 30, 1 << 30), 3);
    assert_eq!(oom_score_adj(QosClass::Burstable, 0, 1 << 30), 999);
}
