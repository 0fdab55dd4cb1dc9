//! Whether a set of objects can migrate to CSI, decided without I/O (`kvol migrate check` feeds it manifests or a live cluster): per in-tree plugin in use, what would migrate to which driver, what would not translate, which secrets are missing, where the driver runs, and which nodes disagree.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PersistentVolume, Pod, SecretReference};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass};
use kvol_api::{FeatureGates, MigratablePlugin};

use crate::{
    SingleSource, TranslateError, inline_plugin, pv_plugin, source, translate_in_tree_inline_volume_to_csi,
    translate_in_tree_pv_to_csi, translate_in_tree_storage_class_to_csi,
};

/// The annotation a CSINode lists its node's migrated plugins in.
pub const MIGRATED_PLUGINS_ANNOTATION: &str = "storage.alpha.kubernetes.io/migrated-plugins";

/// What is checked.
#[derive(Clone, Copy, Debug)]
pub struct CheckInput<'a> {
    pub persistent_volumes: &'a [PersistentVolume],
    pub pods: &'a [Pod],
    pub storage_classes: &'a [StorageClass],
    pub csi_drivers: &'a [CSIDriver],
    pub csi_nodes: &'a [CSINode],
    /// The Secrets that exist, as `namespace/name`.
    pub secrets: &'a BTreeSet<String>,
}

/// One object of an in-tree plugin and whether it translates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectCheck {
    /// `PersistentVolume/name`, `Pod/namespace/name volume`, `StorageClass/name`.
    pub object: String,
    /// Why it would not translate; `None`: it would.
    pub error: Option<String>,
}

/// One in-tree plugin in use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginCheck {
    pub plugin: MigratablePlugin,
    /// Whether the gates given migrate it.
    pub migrated_by_gates: bool,
    /// Whether a CSIDriver object of its driver exists.
    pub csi_driver_object: bool,
    /// The nodes whose CSINode lists the driver.
    pub registered_on: Vec<String>,
    pub objects: Vec<ObjectCheck>,
    /// Secrets the translated volumes reference that do not exist, as `namespace/name`.
    pub missing_secrets: Vec<String>,
}

/// The whole check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigrationCheck {
    pub plugins: Vec<PluginCheck>,
    /// Each node's migrated-plugins annotation, when the nodes do not all agree.
    pub gate_skew: Vec<(String, String)>,
    /// Objects with more than one volume source: no plugin can be named for them.
    pub ambiguous: Vec<ObjectCheck>,
    /// What stands in the way of migrating; empty: nothing does.
    pub blockers: Vec<String>,
}

/// Checks `input` against `gates`.
pub fn check(input: &CheckInput<'_>, gates: &FeatureGates) -> MigrationCheck {
    let mut found: BTreeMap<MigratablePlugin, (Vec<ObjectCheck>, BTreeSet<String>)> = BTreeMap::new();
    let mut ambiguous = Vec::new();
    let mut note =
        |plugin: MigratablePlugin, object: String, translated: Result<PersistentVolume, TranslateError>| {
            let (objects, missing) = found.entry(plugin).or_default();
            match translated {
                Ok(pv) => {
                    missing.extend(secret_refs(&pv).into_iter().filter(|s| !input.secrets.contains(s)));
                    objects.push(ObjectCheck { object, error: None });
                }
                Err(e) => objects.push(ObjectCheck { object, error: Some(e.to_string()) }),
            }
        };
    for pv in input.persistent_volumes {
        let object = format!("PersistentVolume/{}", pv.metadata.name.as_deref().unwrap_or_default());
        match pv_plugin(pv) {
            Ok(plugin) => note(plugin, object, translate_in_tree_pv_to_csi(pv)),
            Err(e @ TranslateError::MultipleSources { .. }) => {
                ambiguous.push(ObjectCheck { object, error: Some(e.to_string()) })
            }
            Err(_) => {}
        }
    }
    for pod in input.pods {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let object = format!("Pod/{namespace}/{name} volume {}", volume.name);
            match inline_plugin(volume) {
                Ok(plugin) => note(plugin, object, translate_in_tree_inline_volume_to_csi(volume, namespace)),
                Err(e) if matches!(source::single_inline_source(volume), SingleSource::Many) => {
                    ambiguous.push(ObjectCheck { object, error: Some(e.to_string()) })
                }
                Err(_) => {}
            }
        }
    }
    for class in input.storage_classes {
        let Some(plugin) = MigratablePlugin::from_in_tree_name(&class.provisioner) else { continue };
        let object = format!("StorageClass/{}", class.metadata.name.as_deref().unwrap_or_default());
        let error =
            translate_in_tree_storage_class_to_csi(&class.provisioner, class).err().map(|e| e.to_string());
        found.entry(plugin).or_default().0.push(ObjectCheck { object, error });
    }

    let gate_skew = gate_skew(input.csi_nodes);
    let plugins: Vec<PluginCheck> = found
        .into_iter()
        .map(|(plugin, (objects, missing))| PluginCheck {
            plugin,
            migrated_by_gates: gates.is_migrated(plugin),
            csi_driver_object: input
                .csi_drivers
                .iter()
                .any(|d| d.metadata.name.as_deref() == Some(plugin.csi_driver())),
            registered_on: registered_on(input.csi_nodes, plugin.csi_driver()),
            objects,
            missing_secrets: missing.into_iter().collect(),
        })
        .collect();
    let blockers = blockers(&plugins, &ambiguous, &gate_skew, !input.csi_nodes.is_empty());
    MigrationCheck { plugins, gate_skew, ambiguous, blockers }
}

/// What blocks: objects that would not translate, missing secrets, a driver no node runs (when
/// nodes are known), and nodes that disagree about what is migrated.
fn blockers(
    plugins: &[PluginCheck],
    ambiguous: &[ObjectCheck],
    gate_skew: &[(String, String)],
    nodes_known: bool,
) -> Vec<String> {
    let mut out = Vec::new();
    for p in plugins {
        let (plugin, driver) = (p.plugin.in_tree_name(), p.plugin.csi_driver());
        for o in &p.objects {
            if let Some(error) = &o.error {
                out.push(format!("{} ({plugin}) would not translate: {error}", o.object));
            }
        }
        for secret in &p.missing_secrets {
            out.push(format!(
                "secret {secret}, referenced by {plugin} volumes after translation, does not exist"
            ));
        }
        if nodes_known && p.registered_on.is_empty() {
            out.push(format!("csi driver {driver} (for {plugin}) is not registered on any node"));
        }
    }
    for o in ambiguous {
        out.push(format!("{}: {}", o.object, o.error.as_deref().unwrap_or_default()));
    }
    if !gate_skew.is_empty() {
        out.push(format!(
            "nodes disagree about the migrated plugins ({}): their feature gates differ",
            gate_skew.iter().map(|(node, value)| format!("{node}: {value:?}")).collect::<Vec<_>>().join(", ")
        ));
    }
    out
}

/// The secret references of a translated CSI volume, as `namespace/name`.
fn secret_refs(pv: &PersistentVolume) -> Vec<String> {
    let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else { return Vec::new() };
    let refs: [&Option<SecretReference>; 5] = [
        &csi.controller_publish_secret_ref,
        &csi.controller_expand_secret_ref,
        &csi.node_expand_secret_ref,
        &csi.node_publish_secret_ref,
        &csi.node_stage_secret_ref,
    ];
    refs.into_iter()
        .flatten()
        .filter_map(|r| {
            Some(format!("{}/{}", r.namespace.as_deref().unwrap_or("default"), r.name.as_deref()?))
        })
        .collect()
}

fn registered_on(csi_nodes: &[CSINode], driver: &str) -> Vec<String> {
    csi_nodes
        .iter()
        .filter(|n| n.spec.drivers.iter().any(|d| d.name == driver))
        .map(|n| n.metadata.name.clone().unwrap_or_default())
        .collect()
}

/// Each node's migrated plugins (sorted, as the annotation lists them), when not all agree.
fn gate_skew(csi_nodes: &[CSINode]) -> Vec<(String, String)> {
    let values: Vec<(String, String)> = csi_nodes
        .iter()
        .map(|n| {
            let value = n.metadata.annotations.as_ref().and_then(|a| a.get(MIGRATED_PLUGINS_ANNOTATION));
            let mut plugins: Vec<&str> = value
                .map(|v| v.split(',').map(str::trim).filter(|p| !p.is_empty()).collect())
                .unwrap_or_default();
            plugins.sort_unstable();
            (n.metadata.name.clone().unwrap_or_default(), plugins.join(","))
        })
        .collect();
    let distinct: BTreeSet<&String> = values.iter().map(|(_, v)| v).collect();
    if distinct.len() > 1 { values } else { Vec::new() }
}

// The rows translate EBS and Azure File objects.
#[cfg(all(test, feature = "aws-ebs", feature = "azure-file"))]
mod tests {
    use super::*;
    use serde_json::json;

    fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).expect("a valid object")
    }

    fn ebs_pv(name: &str) -> PersistentVolume {
        object(json!({"metadata": {"name": name}, "spec": {"awsElasticBlockStore": {"volumeID": "vol-1"},
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}}))
    }

    fn azure_file_pv(name: &str, secret: &str) -> PersistentVolume {
        object(
            json!({"metadata": {"name": name}, "spec": {"azureFile": {"secretName": secret, "shareName": "share",
            "secretNamespace": "shop"}, "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"]}}),
        )
    }

    fn two_sources_pv() -> PersistentVolume {
        object(json!({"metadata": {"name": "both"}, "spec": {"awsElasticBlockStore": {"volumeID": "vol-1"},
            "gcePersistentDisk": {"pdName": "disk"}}}))
    }

    fn pod_with_inline_ebs() -> Pod {
        object(json!({"metadata": {"name": "web", "namespace": "shop"}, "spec": {"containers": [],
            "volumes": [{"name": "data", "awsElasticBlockStore": {"volumeID": "vol-2"}},
                        {"name": "tmp", "emptyDir": {}}]}}))
    }

    fn class(name: &str, provisioner: &str) -> StorageClass {
        object(json!({"metadata": {"name": name}, "provisioner": provisioner}))
    }

    fn csi_node(name: &str, drivers: &[&str], migrated: Option<&str>) -> CSINode {
        let drivers: Vec<_> = drivers.iter().map(|d| json!({"name": d, "nodeID": name})).collect();
        let mut meta = json!({"name": name});
        if let Some(value) = migrated {
            meta["annotations"] = json!({MIGRATED_PLUGINS_ANNOTATION: value});
        }
        object(json!({"metadata": meta, "spec": {"drivers": drivers}}))
    }

    fn driver(name: &str) -> CSIDriver {
        object(json!({"metadata": {"name": name}, "spec": {}}))
    }

    /// A plugin's line: its in-tree name, objects, nodes registered on, CSIDriver object,
    /// missing secrets.
    type PluginLine<'a> = (&'a str, usize, Vec<&'a str>, bool, Vec<&'a str>);

    struct Row {
        name: &'static str,
        pvs: Vec<PersistentVolume>,
        pods: Vec<Pod>,
        classes: Vec<StorageClass>,
        drivers: Vec<CSIDriver>,
        nodes: Vec<CSINode>,
        secrets: Vec<&'static str>,
        plugins: Vec<PluginLine<'static>>,
        /// A fragment of each blocker, in order.
        blockers: Vec<&'static str>,
    }

    fn row(name: &'static str) -> Row {
        Row {
            name,
            pvs: vec![],
            pods: vec![],
            classes: vec![],
            drivers: vec![],
            nodes: vec![],
            secrets: vec![],
            plugins: vec![],
            blockers: vec![],
        }
    }

    #[test]
    fn what_migrates_and_what_blocks_it() {
        let ebs = "ebs.csi.aws.com";
        let rows = vec![
            Row { ..row("nothing in-tree: nothing to say, nothing blocks") },
            Row {
                pvs: vec![ebs_pv("pv-1")],
                pods: vec![pod_with_inline_ebs()],
                classes: vec![class("gp2", "kubernetes.io/aws-ebs"), class("other", "example.com/csi")],
                drivers: vec![driver(ebs)],
                nodes: vec![csi_node("n1", &[ebs], Some("kubernetes.io/aws-ebs"))],
                plugins: vec![("kubernetes.io/aws-ebs", 3, vec!["n1"], true, vec![])],
                ..row("a PV, an inline volume and a class of one plugin, its driver everywhere")
            },
            Row {
                pvs: vec![ebs_pv("pv-1")],
                nodes: vec![csi_node("n1", &["other.csi"], None)],
                plugins: vec![("kubernetes.io/aws-ebs", 1, vec![], false, vec![])],
                blockers: vec!["ebs.csi.aws.com (for kubernetes.io/aws-ebs) is not registered on any node"],
                ..row("a driver no node runs blocks")
            },
            Row {
                pvs: vec![ebs_pv("pv-1")],
                plugins: vec![("kubernetes.io/aws-ebs", 1, vec![], false, vec![])],
                ..row("without nodes, where the driver runs is not judged")
            },
            Row {
                pvs: vec![azure_file_pv("files", "azure-creds"), azure_file_pv("more", "present")],
                secrets: vec!["shop/present"],
                plugins: vec![("kubernetes.io/azure-file", 2, vec![], false, vec!["shop/azure-creds"])],
                blockers: vec!["secret shop/azure-creds"],
                ..row("an azure file secret that does not exist blocks")
            },
            Row {
                classes: vec![{
                    let mut zoned = class("zoned", "kubernetes.io/aws-ebs");
                    zoned.parameters = Some([("zone".to_string(), "us-east-1a".to_string())].into());
                    zoned.allowed_topologies = Some(vec![object(json!({"matchLabelExpressions": [
                        {"key": "topology.kubernetes.io/zone", "values": ["us-east-1b"]}]}))]);
                    zoned
                }],
                plugins: vec![("kubernetes.io/aws-ebs", 1, vec![], false, vec![])],
                blockers: vec!["StorageClass/zoned (kubernetes.io/aws-ebs) would not translate"],
                ..row("a class that would not translate blocks, with the translation's reason")
            },
            Row {
                pvs: vec![two_sources_pv()],
                blockers: vec!["PersistentVolume/both"],
                ..row("a PV with two sources blocks")
            },
            Row {
                pvs: vec![ebs_pv("pv-1")],
                nodes: vec![
                    csi_node("n1", &[ebs], Some("kubernetes.io/aws-ebs,kubernetes.io/gce-pd")),
                    csi_node("n2", &[ebs], Some("kubernetes.io/gce-pd, kubernetes.io/aws-ebs")),
                    csi_node("n3", &[ebs], None),
                ],
                plugins: vec![("kubernetes.io/aws-ebs", 1, vec!["n1", "n2", "n3"], false, vec![])],
                blockers: vec![
                    "nodes disagree about the migrated plugins (n1: \"kubernetes.io/aws-ebs,kubernetes.io/gce-pd\"",
                ],
                ..row("gate skew between nodes blocks; the annotation's order does not matter")
            },
        ];
        let gates = FeatureGates::default();
        for r in rows {
            let secrets: BTreeSet<String> = r.secrets.iter().map(|s| s.to_string()).collect();
            let input = CheckInput {
                persistent_volumes: &r.pvs,
                pods: &r.pods,
                storage_classes: &r.classes,
                csi_drivers: &r.drivers,
                csi_nodes: &r.nodes,
                secrets: &secrets,
            };
            let got = check(&input, &gates);
            let plugins: Vec<PluginLine<'_>> = got
                .plugins
                .iter()
                .map(|p| {
                    (
                        p.plugin.in_tree_name(),
                        p.objects.len(),
                        p.registered_on.iter().map(String::as_str).collect(),
                        p.csi_driver_object,
                        p.missing_secrets.iter().map(String::as_str).collect(),
                    )
                })
                .collect();
            assert_eq!(plugins, r.plugins, "{}", r.name);
            assert_eq!(got.blockers.len(), r.blockers.len(), "{}: {:#?}", r.name, got.blockers);
            for (blocker, fragment) in got.blockers.iter().zip(&r.blockers) {
                assert!(blocker.contains(fragment), "{}: {blocker:?} lacks {fragment:?}", r.name);
            }
        }
    }
}
