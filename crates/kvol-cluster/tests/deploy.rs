//! deploy/cluster/kvol.yaml parses into the API types and keeps its promises: least privilege, bound to the agent's account, and no DaemonSet (its pods would run beside a kubelet, where kvol refuses to act).

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde_json::Value;

fn documents() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/cluster/kvol.yaml");
    let text = std::fs::read_to_string(path).expect("deploy/cluster/kvol.yaml");
    kvol_node::sources::parse_values(&text).expect("valid yaml")
}

fn one<T: serde::de::DeserializeOwned>(kind: &str) -> T {
    let docs: Vec<Value> = documents().into_iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(docs.len(), 1, "one {kind}");
    serde_json::from_value(docs[0].clone()).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

#[test]
fn every_document_is_a_known_kind() {
    let kinds: Vec<String> =
        documents().iter().map(|d| d["kind"].as_str().unwrap_or("?").to_string()).collect();
    assert_eq!(kinds, ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"]);
}

#[test]
fn the_role_reads_secrets_by_name_and_lists_only_what_it_follows() {
    let role: ClusterRole = one("ClusterRole");
    for rule in role.rules.unwrap_or_default() {
        let resources = rule.resources.unwrap_or_default();
        let lists = rule.verbs.iter().any(|v| v == "list" || v == "watch" || v == "*");
        assert!(!rule.verbs.iter().any(|v| v == "*" || v == "delete" || v == "update"), "{resources:?}");
        if lists {
            let listed = ["pods", "csidrivers", "configmaps", "persistentvolumeclaims", "persistentvolumes"];
            assert!(resources.iter().all(|r| listed.contains(&r.as_str())), "lists {resources:?}");
        }
    }
}

#[test]
fn the_role_is_bound_to_the_agents_account() {
    let account: ServiceAccount = one("ServiceAccount");
    let binding: ClusterRoleBinding = one("ClusterRoleBinding");
    let subject = &binding.subjects.expect("subjects")[0];
    assert_eq!(Some(&subject.name), account.metadata.name.as_ref());
}
