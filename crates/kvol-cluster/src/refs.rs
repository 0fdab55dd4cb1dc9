//! Which claims, PersistentVolumes, StorageClasses, Secrets and ConfigMaps a node's pods reference: pure, so the API source reads only those.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, SecretReference, Volume};

/// Names of namespaced objects as `namespace/name`, of cluster-scoped ones as `name`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refs {
    pub claims: BTreeSet<String>,
    pub persistent_volumes: BTreeSet<String>,
    pub storage_classes: BTreeSet<String>,
    pub secrets: BTreeSet<String>,
    pub config_maps: BTreeSet<String>,
}

fn namespace_of(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or(kvol_node::sources::DEFAULT_NAMESPACE)
}

/// What the pods reference directly (all in the pod's namespace): claims; the Secrets of
/// secret, projected, Flexvolume and CSI inline volumes; the ConfigMaps of configMap and
/// projected volumes.
pub fn pod_refs<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Refs {
    let mut refs = Refs::default();
    for pod in pods {
        let ns = namespace_of(pod);
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default();
        for volume in volumes {
            if let Some(claim) = &volume.persistent_volume_claim {
                refs.claims.insert(format!("{ns}/{}", claim.claim_name));
            }
            if let Some(ephemeral) = &volume.ephemeral
                && ephemeral.volume_claim_template.is_some()
            {
                // A generic ephemeral volume's claim is named <pod>-<volume>.
                let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
                refs.claims.insert(format!("{ns}/{pod_name}-{}", volume.name));
            }
            for name in volume_secrets(volume).filter(|n| !n.is_empty()) {
                refs.secrets.insert(format!("{ns}/{name}"));
            }
            for name in volume_config_maps(volume).filter(|n| !n.is_empty()) {
                refs.config_maps.insert(format!("{ns}/{name}"));
            }
        }
    }
    refs
}

/// The names of the Secrets one pod volume references.
fn volume_secrets(volume: &Volume) -> impl Iterator<Item = &str> {
    let direct = [
        volume.secret.as_ref().and_then(|s| s.secret_name.as_deref()),
        volume.flex_volume.as_ref().and_then(|f| f.secret_ref.as_ref()).map(|r| r.name.as_str()),
        volume.csi.as_ref().and_then(|c| c.node_publish_secret_ref.as_ref()).map(|r| r.name.as_str()),
    ];
    let projected = projections(volume).filter_map(|p| p.secret.as_ref()).map(|s| s.name.as_str());
    direct.into_iter().flatten().chain(projected)
}

/// The names of the ConfigMaps one pod volume references.
fn volume_config_maps(volume: &Volume) -> impl Iterator<Item = &str> {
    let direct = volume.config_map.as_ref().map(|c| c.name.as_str());
    let projected = projections(volume).filter_map(|p| p.config_map.as_ref()).map(|c| c.name.as_str());
    direct.into_iter().chain(projected)
}

/// The sources of a projected volume (none for any other volume).
fn projections(volume: &Volume) -> impl Iterator<Item = &k8s_openapi::api::core::v1::VolumeProjection> {
    volume.projected.as_ref().and_then(|p| p.sources.as_deref()).unwrap_or_default().iter()
}

/// Adds what the claims reference: their bound PersistentVolumes and their StorageClasses.
pub fn add_claim_refs<'a>(refs: &mut Refs, claims: impl IntoIterator<Item = &'a PersistentVolumeClaim>) {
    for claim in claims {
        let Some(spec) = &claim.spec else { continue };
        if let Some(pv) = spec.volume_name.as_deref().filter(|n| !n.is_empty()) {
            refs.persistent_volumes.insert(pv.to_string());
        }
        if let Some(class) = spec.storage_class_name.as_deref().filter(|n| !n.is_empty()) {
            refs.storage_classes.insert(class.to_string());
        }
    }
}

/// Adds what the PersistentVolumes reference: their StorageClasses and the Secrets of their CSI
/// (stage, publish, expand) and Flexvolume sources.
pub fn add_volume_refs<'a>(refs: &mut Refs, volumes: impl IntoIterator<Item = &'a PersistentVolume>) {
    for pv in volumes {
        let Some(spec) = &pv.spec else { continue };
        if let Some(class) = spec.storage_class_name.as_deref().filter(|n| !n.is_empty()) {
            refs.storage_classes.insert(class.to_string());
        }
        let mut secrets: Vec<&SecretReference> = Vec::new();
        if let Some(csi) = &spec.csi {
            secrets.extend(csi.node_stage_secret_ref.iter());
            secrets.extend(csi.node_publish_secret_ref.iter());
            secrets.extend(csi.node_expand_secret_ref.iter());
        }
        if let Some(flex) = &spec.flex_volume {
            secrets.extend(flex.secret_ref.iter());
        }
        for secret in secrets {
            let ns = secret.namespace.as_deref().unwrap_or(kvol_node::sources::DEFAULT_NAMESPACE);
            if let Some(name) = secret.name.as_deref().filter(|n| !n.is_empty()) {
                refs.secrets.insert(format!("{ns}/{name}"));
            }
        }
    }
}

/// Splits a `namespace/name` key.
pub fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or((kvol_node::sources::DEFAULT_NAMESPACE, key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(volumes: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [], "volumes": volumes}
        }))
        .expect("a pod")
    }

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn pods_reference_their_claims_and_secrets() {
        let cases: &[(serde_json::Value, &[&str], &[&str])] = &[
            (json!([{"name": "a", "emptyDir": {}}]), &[], &[]),
            (json!([{"name": "a", "persistentVolumeClaim": {"claimName": "c"}}]), &["ns/c"], &[]),
            (json!([{"name": "g", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]), &["ns/p-g"], &[]),
            (json!([{"name": "s", "secret": {"secretName": "top"}}]), &[], &["ns/top"]),
            (
                json!([{"name": "f", "flexVolume": {"driver": "x/y", "secretRef": {"name": "fs"}}}]),
                &[],
                &["ns/fs"],
            ),
            (
                json!([{"name": "i", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "cs"}}}]),
                &[],
                &["ns/cs"],
            ),
            (json!([{"name": "i", "csi": {"driver": "d", "nodePublishSecretRef": {"name": ""}}}]), &[], &[]),
        ];
        for (volumes, claims, secrets) in cases {
            let refs = pod_refs([&pod(volumes.clone())]);
            assert_eq!(refs.claims, set(claims), "{volumes}");
            assert_eq!(refs.secrets, set(secrets), "{volumes}");
        }
    }

    #[test]
    fn pods_reference_config_maps_and_secrets_directly_and_through_projections() {
        let cases: &[(&str, serde_json::Value, &[&str], &[&str])] = &[
            ("none", json!([{"name": "a", "emptyDir": {}}]), &[], &[]),
            ("configMap", json!([{"name": "c", "configMap": {"name": "cm"}}]), &["ns/cm"], &[]),
            ("configMap, no name", json!([{"name": "c", "configMap": {}}]), &[], &[]),
            (
                "configMap, optional",
                json!([{"name": "c", "configMap": {"name": "o", "optional": true}}]),
                &["ns/o"],
                &[],
            ),
            ("secret", json!([{"name": "s", "secret": {"secretName": "sec"}}]), &[], &["ns/sec"]),
            ("secret, no name", json!([{"name": "s", "secret": {}}]), &[], &[]),
            (
                "projected",
                json!([{"name": "p", "projected": {"sources": [
                    {"configMap": {"name": "pcm"}},
                    {"secret": {"name": "psec"}},
                    {"downwardAPI": {"items": []}},
                    {"serviceAccountToken": {"path": "token"}}
                ]}}]),
                &["ns/pcm"],
                &["ns/psec"],
            ),
            (
                "projected, two of each",
                json!([{"name": "p", "projected": {"sources": [
                    {"configMap": {"name": "a"}}, {"configMap": {"name": "b"}},
                    {"secret": {"name": "x"}}, {"secret": {"name": "y"}}
                ]}}]),
                &["ns/a", "ns/b"],
                &["ns/x", "ns/y"],
            ),
            ("projected, no sources", json!([{"name": "p", "projected": {}}]), &[], &[]),
            (
                "projected, empty names",
                json!([{"name": "p", "projected": {"sources": [{"configMap": {}}, {"secret": {}}]}}]),
                &[],
                &[],
            ),
            (
                "the same object twice",
                json!([
                    {"name": "c", "configMap": {"name": "cm"}},
                    {"name": "p", "projected": {"sources": [{"configMap": {"name": "cm"}}, {"secret": {"name": "s"}}]}},
                    {"name": "s", "secret": {"secretName": "s"}}
                ]),
                &["ns/cm"],
                &["ns/s"],
            ),
        ];
        for (name, volumes, config_maps, secrets) in cases {
            let refs = pod_refs([&pod(volumes.clone())]);
            assert_eq!(refs.config_maps, set(config_maps), "{name}");
            assert_eq!(refs.secrets, set(secrets), "{name}");
            assert!(refs.claims.is_empty(), "{name}");
        }
    }

    #[test]
    fn pods_of_two_namespaces_sharing_a_config_map_name_reference_two_objects() {
        let mut other = pod(json!([{"name": "c", "configMap": {"name": "cm"}}]));
        other.metadata.namespace = Some("other".into());
        let mine = pod(json!([{"name": "c", "configMap": {"name": "cm"}}]));
        let same = pod(json!([{"name": "p", "projected": {"sources": [{"configMap": {"name": "cm"}}]}}]));
        let refs = pod_refs([&mine, &same, &other]);
        assert_eq!(refs.config_maps, set(&["ns/cm", "other/cm"]));
    }

    #[test]
    fn claims_and_volumes_reference_volumes_classes_and_secrets() {
        let claims: Vec<PersistentVolumeClaim> = vec![
            serde_json::from_value(json!({"spec": {"volumeName": "pv1", "storageClassName": "fast"}}))
                .unwrap(),
            serde_json::from_value(json!({"spec": {"storageClassName": ""}})).unwrap(),
            serde_json::from_value(json!({})).unwrap(),
        ];
        let pv: PersistentVolume = serde_json::from_value(json!({
            "spec": {"storageClassName": "slow", "csi": {
                "driver": "d", "volumeHandle": "h",
                "nodeStageSecretRef": {"name": "st", "namespace": "kube-system"},
                "nodePublishSecretRef": {"name": "pu"}
            }}
        }))
        .unwrap();
        let mut refs = Refs::default();
        add_claim_refs(&mut refs, &claims);
        add_volume_refs(&mut refs, [&pv]);
        assert_eq!(refs.persistent_volumes, set(&["pv1"]));
        assert_eq!(refs.storage_classes, set(&["fast", "slow"]));
        assert_eq!(refs.secrets, set(&["kube-system/st", "default/pu"]));
    }

    #[test]
    fn keys_split_into_namespace_and_name() {
        assert_eq!(split_key("ns/a"), ("ns", "a"));
        assert_eq!(split_key("a"), ("default", "a"));
    }
}
