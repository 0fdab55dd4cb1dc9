use serde_json::json;

use super::*;

fn pod(spec: serde_json::Value) -> Pod {
    let mut spec = spec;
    if spec.get("containers").is_none() {
        spec["containers"] = json!([{"name": "c", "image": "busybox"}]);
    }
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "shop", "uid": "u-1", "labels": {"app": "web"}},
        "spec": spec
    }))
    .unwrap()
}

const HOST_RESOLV: &str = "# generated\nnameserver 10.0.0.2\nnameserver 10.0.0.3 ; second\nsearch old.example\nsearch corp.example. .\noptions ndots:2 edns0\n";

fn context(cluster_dns: &[&str]) -> SandboxContext {
    SandboxContext {
        log_root: PathBuf::from("/var/log/pods"),
        host_resolv_conf: HOST_RESOLV.into(),
        cluster_dns: cluster_dns.iter().map(|s| s.to_string()).collect(),
        cluster_domain: "cluster.local".into(),
    }
}

fn dns(servers: &[&str], searches: &[&str], options: &[&str]) -> cri::DnsConfig {
    let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    cri::DnsConfig { servers: own(servers), searches: own(searches), options: own(options) }
}

#[test]
fn dns_by_policy() {
    let host = dns(&["10.0.0.2", "10.0.0.3"], &["corp.example"], &["ndots:2", "edns0"]);
    let cluster = dns(
        &["10.96.0.10"],
        &["shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example"],
        &["ndots:5"],
    );
    // (case, spec, cluster dns, expected)
    let cases: Vec<(&str, serde_json::Value, &[&str], cri::DnsConfig)> = vec![
        ("default policy, no cluster dns: the host's", json!({}), &[], host.clone()),
        ("ClusterFirst with cluster dns", json!({}), &["10.96.0.10"], cluster.clone()),
        (
            "ClusterFirst on the host network: the host's",
            json!({"hostNetwork": true}),
            &["10.96.0.10"],
            host.clone(),
        ),
        (
            "ClusterFirstWithHostNet",
            json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"}),
            &["10.96.0.10"],
            cluster.clone(),
        ),
        ("Default", json!({"dnsPolicy": "Default"}), &["10.96.0.10"], host.clone()),
        ("None without dnsConfig", json!({"dnsPolicy": "None"}), &[], dns(&[], &[], &[])),
        (
            "None with dnsConfig",
            json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["1.1.1.1"], "searches": ["a.b"],
                "options": [{"name": "ndots", "value": "1"}, {"name": "rotate"}]}}),
            &[],
            dns(&["1.1.1.1"], &["a.b"], &["ndots:1", "rotate"]),
        ),
        (
            "dnsConfig laid over the host's: duplicates dropped, an option replaced",
            json!({"dnsConfig": {"nameservers": ["10.0.0.2", "9.9.9.9"], "options": [{"name": "ndots", "value": "3"}]}}),
            &[],
            dns(&["10.0.0.2", "10.0.0.3", "9.9.9.9"], &["corp.example"], &["ndots:3", "edns0"]),
        ),
    ];
    for (name, spec, cluster_dns, want) in cases {
        assert_eq!(dns_config(&pod(spec), &context(cluster_dns)), want, "{name}");
    }
}

#[test]
fn namespaces_and_hostname() {
    use cri::NamespaceMode::{Container, Node, Pod as InPod};
    // (case, spec, network, pid, ipc, hostname)
    let long = "a".repeat(62) + "-b";
    let cases: Vec<(
        &str,
        serde_json::Value,
        cri::NamespaceMode,
        cri::NamespaceMode,
        cri::NamespaceMode,
        String,
    )> = vec![
        ("plain", json!({}), InPod, Container, InPod, "web".into()),
        ("host network: no hostname", json!({"hostNetwork": true}), Node, Container, InPod, String::new()),
        ("host pid and ipc", json!({"hostPID": true, "hostIPC": true}), InPod, Node, Node, "web".into()),
        ("shared pid", json!({"shareProcessNamespace": true}), InPod, InPod, InPod, "web".into()),
        ("spec hostname", json!({"hostname": "front"}), InPod, Container, InPod, "front".into()),
        (
            "long hostname cut, dash trimmed",
            json!({"hostname": long}),
            InPod,
            Container,
            InPod,
            "a".repeat(62),
        ),
    ];
    for (name, spec, network, pid, ipc, host) in cases {
        let config = sandbox_config(&pod(spec), 0, &context(&[]));
        let ns = config.linux.unwrap().security_context.unwrap().namespace_options.unwrap();
        assert_eq!((ns.network, ns.pid, ns.ipc), (network as i32, pid as i32, ipc as i32), "{name}");
        assert_eq!(config.hostname, host, "{name}");
    }
}

#[test]
fn metadata_logs_ports_labels_and_security() {
    let spec = json!({
        "securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000, "supplementalGroups": [4000],
            "sysctls": [{"name": "net.core.somaxconn", "value": "1024"}]},
        "containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": true},
            "ports": [{"containerPort": 80, "hostPort": 8080}, {"containerPort": 53, "protocol": "UDP"}]}]
    });
    let config = sandbox_config(&pod(spec), 2, &context(&[]));
    let meta = config.metadata.as_ref().unwrap();
    assert_eq!(
        (meta.name.as_str(), meta.namespace.as_str(), meta.uid.as_str(), meta.attempt),
        ("web", "shop", "u-1", 2)
    );
    assert_eq!(config.log_directory, "/var/log/pods/shop_web_u-1");
    assert_eq!(config.labels.get("io.kubernetes.pod.uid").map(String::as_str), Some("u-1"));
    assert_eq!(config.labels.get("app").map(String::as_str), Some("web"));
    let ports: Vec<_> =
        config.port_mappings.iter().map(|p| (p.protocol, p.container_port, p.host_port)).collect();
    assert_eq!(ports, vec![(cri::Protocol::Tcp as i32, 80, 8080), (cri::Protocol::Udp as i32, 53, 0)]);
    let linux = config.linux.unwrap();
    assert_eq!(linux.sysctls.get("net.core.somaxconn").map(String::as_str), Some("1024"));
    let sc = linux.security_context.unwrap();
    assert_eq!(sc.run_as_user, Some(cri::Int64Value { value: 1000 }));
    assert_eq!(sc.run_as_group, Some(cri::Int64Value { value: 3000 }));
    assert_eq!(sc.supplemental_groups, vec![2000, 4000]);
    assert!(sc.privileged);
    assert_eq!(sc.seccomp.unwrap().profile_type, cri::security_profile::ProfileType::Unconfined as i32);
}
