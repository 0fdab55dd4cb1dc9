//! The `/etc/hosts` kubelet gives a pod's containers (its `pods/<uid>/etc-hosts`): the managed file with the pod's own names, or the node's file under host networking, each with the pod's `hostAliases`; pure.

use k8s_openapi::api::core::v1::Pod;

use crate::labels::PodIds;
use crate::sandbox::hostname;

/// Where a container sees the file.
pub const CONTAINER_PATH: &str = "/etc/hosts";

/// The file's text for `pod`: under host networking the node's own hosts file (`node_hosts`)
/// under kubelet's header, else the managed file naming `pod_ips` as the pod's host; both end
/// with the pod's `hostAliases`.
pub fn hosts_file(pod: &Pod, pod_ips: &[String], node_hosts: &str, cluster_domain: &str) -> String {
    let spec = pod.spec.as_ref();
    let mut text = if spec.and_then(|s| s.host_network).unwrap_or(false) {
        format!("# Kubernetes-managed hosts file (host network).\n{node_hosts}")
    } else {
        managed(pod, pod_ips, cluster_domain)
    };
    let aliases = spec.and_then(|s| s.host_aliases.as_ref()).filter(|a| !a.is_empty());
    if let Some(aliases) = aliases {
        text.push_str("\n# Entries added by HostAliases.\n");
        for alias in aliases {
            let names = alias.hostnames.clone().unwrap_or_default().join("\t");
            text.push_str(&format!("{}\t{names}\n", alias.ip));
        }
    }
    text
}

fn managed(pod: &Pod, pod_ips: &[String], cluster_domain: &str) -> String {
    let mut text = String::from(concat!(
        "# Kubernetes-managed hosts file.\n",
        "127.0.0.1\tlocalhost\n",
        "::1\tlocalhost ip6-localhost ip6-loopback\n",
        "fe00::0\tip6-localnet\n",
        "fe00::0\tip6-mcastprefix\n",
        "fe00::1\tip6-allnodes\n",
        "fe00::2\tip6-allrouters\n",
    ));
    let host = hostname(pod);
    let subdomain = pod.spec.as_ref().and_then(|s| s.subdomain.clone()).filter(|s| !s.is_empty());
    for ip in pod_ips {
        match &subdomain {
            Some(sub) => {
                let namespace = PodIds::of(pod).namespace;
                text.push_str(&format!("{ip}\t{host}.{sub}.{namespace}.svc.{cluster_domain}\t{host}\n"));
            }
            None => text.push_str(&format!("{ip}\t{host}\n")),
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "web", "namespace": "shop", "uid": "u"}, "spec": spec}),
        )
        .unwrap()
    }

    const LOCAL: &str = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n";

    #[test]
    fn the_files_kubelet_writes() {
        let ips = vec!["10.88.0.7".to_string()];
        let aliases = json!([{"ip": "192.0.2.9", "hostnames": ["db", "db.local"]}]);
        let cases = [
            (json!({"containers": []}), format!("{LOCAL}10.88.0.7\tweb\n")),
            (
                json!({"containers": [], "hostname": "front", "subdomain": "svc1"}),
                format!("{LOCAL}10.88.0.7\tfront.svc1.shop.svc.cluster.local\tfront\n"),
            ),
            (
                json!({"containers": [], "hostAliases": aliases}),
                format!("{LOCAL}10.88.0.7\tweb\n\n# Entries added by HostAliases.\n192.0.2.9\tdb\tdb.local\n"),
            ),
            (
                json!({"containers": [], "hostNetwork": true}),
                "# Kubernetes-managed hosts file (host network).\n127.0.0.1 node1\n".to_string(),
            ),
            (
                json!({"containers": [], "hostNetwork": true, "hostAliases": aliases}),
                "# Kubernetes-managed hosts file (host network).\n127.0.0.1 node1\n\n# Entries added by HostAliases.\n192.0.2.9\tdb\tdb.local\n".to_string(),
            ),
        ];
        for (spec, want) in cases {
            assert_eq!(
                hosts_file(&pod(spec.clone()), &ips, "127.0.0.1 node1\n", "cluster.local"),
                want,
                "{spec}"
            );
        }
    }
}
