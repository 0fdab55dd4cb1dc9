//! Table tests of the migration decisions: the phase-by-gate matrix, resolution and the control-plane rules.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, Volume};
use serde_json::json;

use super::*;
use crate::intree::InTreeDescriptor;
use crate::plugin::VolumePlugin;
use crate::registry::PluginRegistry;
use crate::spec::SourceKey;
use MigratablePlugin::*;

/// A registered CSI driver, as the CSI issue will register them.
#[derive(Debug)]
struct Driver(&'static str);

impl VolumePlugin for Driver {
    fn name(&self) -> &str {
        self.0
    }
    fn kind(&self) -> PluginKind {
        PluginKind::Csi
    }
    fn serves(&self) -> Vec<SourceKey<'_>> {
        vec![SourceKey::Csi(self.0)]
    }
}

fn gates(flag: &str) -> FeatureGates {
    FeatureGates::parse(flag).unwrap_or_else(|e| panic!("gates {flag:?}: {e}"))
}

fn node(annotation: &[MigratablePlugin], drivers: &[MigratablePlugin]) -> NodeMigration {
    NodeMigration {
        node: "node-1".to_string(),
        migrated_plugins: annotation.iter().map(|p| p.in_tree_name().to_string()).collect(),
        drivers: drivers.iter().map(|p| p.csi_driver().to_string()).collect(),
    }
}

fn ebs_pv(name: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"awsElasticBlockStore": {"volumeID": "vol-0123", "fsType": "ext4"}, "accessModes": ["ReadWriteOnce"]}
    }))
    .unwrap()
}

fn rbd_pv(name: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"rbd": {"monitors": ["10.0.0.1:6789"], "image": "img", "pool": "rbd",
                         "user": "admin", "secretRef": {"name": "ceph", "namespace": "kube-system"}},
                 "accessModes": ["ReadWriteOnce"]}
    }))
    .unwrap()
}

fn portworx_inline(name: &str) -> Volume {
    serde_json::from_value(json!({"name": name, "portworxVolume": {"volumeID": "px-1"}})).unwrap()
}

const ALL_MIGRATED: &[MigratablePlugin] = &[AwsEbs, Portworx, Rbd];

/// The phase-by-gate matrix: every gate era against every node state, for a GA-migrated cloud
/// plugin (AWS EBS), Portworx and the off-by-default RBD.
#[test]
fn decision_matrix() {
    #[derive(Clone, Copy)]
    enum State {
        Migrated,
        NoDriver,
        NotAnnotated,
        Missing,
    }
    use State::*;
    // (gates, plugin, expected per node state [Migrated, NoDriver, NotAnnotated, NoCsiNode])
    let csi = "csi";
    let intree = "in-tree";
    let no_driver = "error: driver not installed";
    let no_csinode = "error: no csinode";
    let phase1 = [csi, no_driver, intree, no_csinode];
    let unmigrated = [intree, intree, intree, intree];
    let complete = [csi, csi, csi, csi];
    let rows: &[(&str, MigratablePlugin, [&str; 4])] = &[
        // Defaults today: cloud plugins and Portworx migrated (phase 1), RBD not.
        ("", AwsEbs, phase1),
        ("", Portworx, phase1),
        ("", Rbd, unmigrated),
        // RBD migration on, in-tree still registered: phase 1.
        ("CSIMigrationRBD=true", Rbd, phase1),
        ("CSIMigrationRBD=true", AwsEbs, phase1),
        // Phase 2 per plugin: Unregister completes migration; the node is not asked.
        ("CSIMigrationRBD=true,InTreePluginRBDUnregister=true", Rbd, complete),
        ("CSIMigrationRBD=true,InTreePluginRBDUnregister=true", AwsEbs, phase1),
        ("InTreePluginPortworxUnregister=true", Portworx, complete),
        ("InTreePluginPortworxUnregister=true", AwsEbs, phase1),
        ("InTreePluginAWSUnregister=true", AwsEbs, complete),
        // The umbrella turns in-tree code off for every migrated plugin, and leaves RBD alone.
        ("CSIMigrationInTreeOff=true", AwsEbs, complete),
        ("CSIMigrationInTreeOff=true", Portworx, complete),
        ("CSIMigrationInTreeOff=true", Rbd, unmigrated),
        ("CSIMigrationInTreeOff=true,CSIMigrationRBD=true", Rbd, complete),
    ];
    let migrated = node(ALL_MIGRATED, ALL_MIGRATED);
    let no_driver_node = node(ALL_MIGRATED, &[]);
    let not_annotated = node(&[], ALL_MIGRATED);
    for (flag, plugin, expected) in rows {
        let g = gates(flag);
        for (state, want) in [Migrated, NoDriver, NotAnnotated, Missing].into_iter().zip(expected) {
            let status = match state {
                Migrated => NodeStatus::Known(&migrated),
                NoDriver => NodeStatus::Known(&no_driver_node),
                NotAnnotated => NodeStatus::Known(&not_annotated),
                Missing => NodeStatus::NoCsiNode { node: "node-1" },
            };
            let got = match decide(&g, *plugin, status) {
                Ok(Route::Csi(p)) if p == *plugin => "csi",
                Ok(Route::InTree(p)) if p == *plugin => "in-tree",
                Ok(other) => panic!("{flag:?} {plugin}: unexpected {other:?}"),
                Err(PluginError::DriverNotInstalled { plugin: p, node })
                    if p == *plugin && node == "node-1" =>
                {
                    "error: driver not installed"
                }
                Err(PluginError::NoCsiNode { plugin: p, .. }) if p == *plugin => "error: no csinode",
                Err(e) => panic!("{flag:?} {plugin}: unexpected error {e}"),
            };
            assert_eq!(got, *want, "gates {flag:?}, plugin {plugin}, node state #{}", state as u8);
        }
    }
}

#[test]
fn native_specs_are_never_routed() {
    let csi: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "native"},
        "spec": {"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}}
    }))
    .unwrap();
    let spec = VolumeSpec::persistent(csi);
    let route = decide_for_spec(&gates(""), &spec, NodeStatus::NoCsiNode { node: "n" }).unwrap();
    assert_eq!(route, Route::Native, "a native CSI spec of a migration driver is not a migrated spec");
}

#[test]
fn csinode_annotation_and_drivers_are_read() {
    let csinode: CSINode = serde_json::from_value(json!({
        "metadata": {"name": "n1", "annotations": {ANN_MIGRATED_PLUGINS: "kubernetes.io/aws-ebs, ,kubernetes.io/gce-pd"}},
        "spec": {"drivers": [{"name": "ebs.csi.aws.com", "nodeID": "i-1"}]}
    }))
    .unwrap();
    let n = NodeMigration::from_csinode(&csinode);
    assert_eq!(n.node, "n1");
    assert_eq!(n.annotation_value(), "kubernetes.io/aws-ebs,kubernetes.io/gce-pd");
    assert_eq!(n.drivers.iter().collect::<Vec<_>>(), ["ebs.csi.aws.com"]);
    assert_eq!(decide(&gates(""), AwsEbs, NodeStatus::Known(&n)).unwrap(), Route::Csi(AwsEbs));
    let err = decide(&gates(""), GcePd, NodeStatus::Known(&n)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "in-tree plugin kubernetes.io/gce-pd is migrated on node \"n1\" but its CSI driver pd.csi.storage.gke.io is not installed there"
    );
    let own = NodeMigration::of_own_node("n2", &gates("CSIMigrationRBD=true"), ["rbd.csi.ceph.com"]);
    assert!(own.migrated_plugins.contains("kubernetes.io/rbd"));
    assert!(own.annotation_value().starts_with("kubernetes.io/aws-ebs,kubernetes.io/azure-disk,"));
}

fn registry_with(drivers: &[&'static str], in_tree_off: &FeatureGates) -> PluginRegistry {
    let descriptors = MigratablePlugin::ALL
        .into_iter()
        .filter(|p| !in_tree_off.is_in_tree_off(*p))
        .map(|p| Arc::new(InTreeDescriptor::new(p)) as PluginRef);
    let registry = PluginRegistry::new(descriptors.collect()).unwrap();
    let refused = registry.apply(
        crate::registry::DynamicSource::Csi,
        drivers.iter().map(|d| crate::registry::ProbeEvent::AddOrUpdate(Arc::new(Driver(d)))),
    );
    assert!(refused.is_empty());
    registry
}

/// Resolution end to end over a real snapshot: (gates, node, spec, expected plugin or error).
#[test]
fn resolution_table() {
    let all_nodes = node(ALL_MIGRATED, ALL_MIGRATED);
    let unmigrated = node(&[], ALL_MIGRATED);
    let ebs = VolumeSpec::persistent(ebs_pv("pv-ebs")).with_read_only(true);
    let rbd = VolumeSpec::persistent(rbd_pv("pv-rbd"));
    let px = VolumeSpec::inline(portworx_inline("px"), "team-a");
    struct Row<'a> {
        flag: &'a str,
        drivers: &'a [&'static str],
        node: NodeStatus<'a>,
        spec: &'a VolumeSpec,
        want: Result<&'a str, &'a str>,
    }
    let rows = [
        // Phase 1, node migrated, driver registered: the CSI driver serves the translated spec.
        Row {
            flag: "",
            drivers: &["ebs.csi.aws.com"],
            node: NodeStatus::Known(&all_nodes),
            spec: &ebs,
            want: Ok("ebs.csi.aws.com"),
        },
        // Phase 1, node migrated but the driver never registered here.
        Row {
            flag: "",
            drivers: &[],
            node: NodeStatus::Known(&all_nodes),
            spec: &ebs,
            want: Err(
                "persistent volume \"pv-ebs\" uses in-tree plugin kubernetes.io/aws-ebs, migrated to CSI driver ebs.csi.aws.com, which is not registered on this node",
            ),
        },
        // Phase 1, node not migrated: in-tree, which kvol does not carry.
        Row {
            flag: "",
            drivers: &["ebs.csi.aws.com"],
            node: NodeStatus::Known(&unmigrated),
            spec: &ebs,
            want: Err(
                "persistent volume \"pv-ebs\" uses in-tree plugin kubernetes.io/aws-ebs but node \"node-1\" has not migrated it (its CSINode annotation storage.alpha.kubernetes.io/migrated-plugins does not list it), and kvol has no in-tree code for it",
            ),
        },
        // RBD with migration off: the error names the gate to turn on.
        Row {
            flag: "",
            drivers: &["rbd.csi.ceph.com"],
            node: NodeStatus::Known(&all_nodes),
            spec: &rbd,
            want: Err(
                "persistent volume \"pv-rbd\" uses in-tree plugin kubernetes.io/rbd, which kvol serves only through CSI driver rbd.csi.ceph.com: turn on feature gate CSIMigrationRBD=true",
            ),
        },
        // Phase 2: RBD's in-tree plugin is not registered, its spec is translated first, the
        // node (without a CSINode) is not asked.
        Row {
            flag: "CSIMigrationRBD=true,InTreePluginRBDUnregister=true",
            drivers: &["rbd.csi.ceph.com"],
            node: NodeStatus::NoCsiNode { node: "node-1" },
            spec: &rbd,
            want: Ok("rbd.csi.ceph.com"),
        },
        // Phase 2 with the driver missing: still never "no volume plugin matched".
        Row {
            flag: "CSIMigrationRBD=true,InTreePluginRBDUnregister=true",
            drivers: &[],
            node: NodeStatus::NoCsiNode { node: "node-1" },
            spec: &rbd,
            want: Err(
                "persistent volume \"pv-rbd\" uses in-tree plugin kubernetes.io/rbd, migrated to CSI driver rbd.csi.ceph.com, which is not registered on this node",
            ),
        },
        // Portworx with all its gates on: complete, inline specs translated with their namespace.
        Row {
            flag: "InTreePluginPortworxUnregister=true",
            drivers: &["pxd.portworx.com"],
            node: NodeStatus::NoCsiNode { node: "node-1" },
            spec: &px,
            want: Ok("pxd.portworx.com"),
        },
        // Phase 1 without a CSINode: the decision cannot be made.
        Row {
            flag: "",
            drivers: &["pxd.portworx.com"],
            node: NodeStatus::NoCsiNode { node: "node-1" },
            spec: &px,
            want: Err(
                "cannot decide migration of kubernetes.io/portworx-volume on node \"node-1\": the node has no CSINode object yet",
            ),
        },
    ];
    for (i, row) in rows.iter().enumerate() {
        let g = gates(row.flag);
        let registry = registry_with(row.drivers, &g);
        let snap = registry.snapshot();
        let got = resolve(&snap, &g, row.spec, row.node).map(|r| {
            if let Route::Csi(p) = r.route {
                let marker = r.spec.migrated.as_ref().expect("a translated spec carries the marker");
                assert_eq!(marker.from, p, "row {i}");
                assert_eq!(r.spec.read_only, row.spec.read_only, "row {i}: readOnly kept");
                assert_eq!(r.spec.csi_driver(), Some(p.csi_driver()), "row {i}");
            }
            r.plugin.name().to_string()
        });
        let got = got.map_err(|e| e.to_string());
        assert_eq!(got.as_deref().map_err(String::as_str), row.want, "row {i} ({:?})", row.flag);
    }
}

#[test]
fn translated_specs_turn_back_for_unmigrated_nodes() {
    let g = gates("");
    let all_nodes = node(ALL_MIGRATED, ALL_MIGRATED);
    let unmigrated = node(&[], ALL_MIGRATED);
    let registry = registry_with(&["ebs.csi.aws.com", "pxd.portworx.com"], &g);
    let snap = registry.snapshot();

    // A persistent volume: translated on a migrated node …
    let ebs = VolumeSpec::persistent(ebs_pv("pv-ebs"));
    let translated = resolve(&snap, &g, &ebs, NodeStatus::Known(&all_nodes)).unwrap().spec.into_owned();
    assert!(translated.pv().unwrap().spec.as_ref().unwrap().csi.is_some());
    // … stays translated there (no second translation) …
    let again = resolve(&snap, &g, &translated, NodeStatus::Known(&all_nodes)).unwrap();
    assert!(matches!(again.spec, Cow::Borrowed(_)));
    // … and turns back into the in-tree source for a node that is not migrated.
    let back = turn_back(&translated).unwrap();
    assert!(back.migrated.is_none());
    let source = back.pv().unwrap().spec.as_ref().unwrap().aws_elastic_block_store.as_ref().unwrap();
    assert_eq!(source.volume_id, "vol-0123");
    let err = resolve(&snap, &g, &translated, NodeStatus::Known(&unmigrated)).unwrap_err();
    assert!(matches!(err, PluginError::NodeNotMigrated { plugin: AwsEbs, .. }), "{err}");

    // An inline volume turns back into exactly the pod's volume.
    let px = VolumeSpec::inline(portworx_inline("px"), "team-a");
    let translated = translate_spec(&px).unwrap();
    assert_eq!(translated.csi_driver(), Some("pxd.portworx.com"));
    assert_eq!(turn_back(&translated).unwrap(), px);

    // A native CSI spec is not a translation and cannot be turned back.
    let err = turn_back(&VolumeSpec::persistent(ebs_pv("x"))).unwrap_err();
    assert_eq!(
        err.to_string(),
        "persistent volume \"x\": is not a translated spec, so there is nothing to turn back"
    );
}

#[test]
fn the_marker_survives_serialisation() {
    let translated = translate_spec(&VolumeSpec::inline(portworx_inline("px"), "ns")).unwrap();
    let text = serde_json::to_string(&translated).unwrap();
    assert!(text.contains("\"from\":\"kubernetes.io/portworx-volume\""), "{text}");
    let back: VolumeSpec = serde_json::from_str(&text).unwrap();
    assert_eq!(back, translated);
}

#[test]
fn bad_specs_fail_before_any_decision() {
    let g = gates("");
    let registry = registry_with(&[], &g);
    let snap = registry.snapshot();
    let two: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "two"},
        "spec": {"hostPath": {"path": "/x"}, "nfs": {"server": "s", "path": "/"}}
    }))
    .unwrap();
    let err =
        resolve(&snap, &g, &VolumeSpec::persistent(two), NodeStatus::NoCsiNode { node: "n" }).unwrap_err();
    assert_eq!(
        err.to_string(),
        "persistent volume \"two\" has more than one volume source (hostPath, nfs); exactly one is allowed"
    );
    let none: PersistentVolume =
        serde_json::from_value(json!({"metadata": {"name": "none"}, "spec": {}})).unwrap();
    let err =
        resolve(&snap, &g, &VolumeSpec::persistent(none), NodeStatus::NoCsiNode { node: "n" }).unwrap_err();
    assert_eq!(err.to_string(), "persistent volume \"none\" sets no volume source");
    // Two in-tree sources: the translation library's own refusal, named.
    let both: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "both"},
        "spec": {"awsElasticBlockStore": {"volumeID": "v"}, "gcePersistentDisk": {"pdName": "p"}}
    }))
    .unwrap();
    let err =
        resolve(&snap, &g, &VolumeSpec::persistent(both), NodeStatus::NoCsiNode { node: "n" }).unwrap_err();
    assert!(err.to_string().contains("more than one volume source"), "{err}");
}

#[test]
fn provisioner_names() {
    let rows = [
        ("", "kubernetes.io/aws-ebs", "ebs.csi.aws.com"),
        ("", "kubernetes.io/portworx-volume", "pxd.portworx.com"),
        ("", "kubernetes.io/rbd", "kubernetes.io/rbd"),
        ("CSIMigrationRBD=true", "kubernetes.io/rbd", "rbd.csi.ceph.com"),
        ("", "example.com/nfs", "example.com/nfs"),
        ("", "ebs.csi.aws.com", "ebs.csi.aws.com"),
    ];
    for (flag, provisioner, want) in rows {
        assert_eq!(provisioner_for(&gates(flag), provisioner), want, "{flag:?} {provisioner}");
    }
}

#[test]
fn migrated_to_annotation_is_set_and_rolled_back() {
    // (gates, object, annotations before, changed?, migrated-to after)
    type Row<'a> = (&'a str, Annotated, &'a [(&'a str, &'a str)], bool, Option<&'a str>);
    let rows: &[Row] = &[
        (
            "",
            Annotated::Claim,
            &[(ANN_STORAGE_PROVISIONER, "kubernetes.io/aws-ebs")],
            true,
            Some("ebs.csi.aws.com"),
        ),
        (
            "",
            Annotated::Claim,
            &[(ANN_BETA_STORAGE_PROVISIONER, "kubernetes.io/gce-pd")],
            true,
            Some("pd.csi.storage.gke.io"),
        ),
        (
            "",
            Annotated::Claim,
            &[(ANN_STORAGE_PROVISIONER, "kubernetes.io/aws-ebs"), (ANN_MIGRATED_TO, "ebs.csi.aws.com")],
            false,
            Some("ebs.csi.aws.com"),
        ),
        // Rollback: RBD migration turned off again removes the annotation.
        (
            "",
            Annotated::Volume,
            &[(ANN_PROVISIONED_BY, "kubernetes.io/rbd"), (ANN_MIGRATED_TO, "rbd.csi.ceph.com")],
            true,
            None,
        ),
        (
            "CSIMigrationRBD=true",
            Annotated::Volume,
            &[(ANN_PROVISIONED_BY, "kubernetes.io/rbd")],
            true,
            Some("rbd.csi.ceph.com"),
        ),
        // A PV's provisioner is provisioned-by, not the claim key.
        ("", Annotated::Volume, &[(ANN_STORAGE_PROVISIONER, "kubernetes.io/aws-ebs")], false, None),
        // Statically provisioned: no provisioner, left alone even with a stale annotation.
        ("", Annotated::Volume, &[(ANN_MIGRATED_TO, "ebs.csi.aws.com")], false, Some("ebs.csi.aws.com")),
        // A CSI provisioner is not migrated: a stale annotation goes.
        (
            "",
            Annotated::Claim,
            &[(ANN_STORAGE_PROVISIONER, "example.com/x"), (ANN_MIGRATED_TO, "x")],
            true,
            None,
        ),
    ];
    for (i, (flag, object, before, changed, after)) in rows.iter().enumerate() {
        let mut ann: BTreeMap<String, String> =
            before.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert_eq!(sync_migrated_to(&gates(flag), &mut ann, *object), *changed, "row {i}");
        assert_eq!(ann.get(ANN_MIGRATED_TO).map(String::as_str), *after, "row {i}");
        assert!(!sync_migrated_to(&gates(flag), &mut ann, *object), "row {i}: a second sync changes nothing");
    }
}

#[test]
fn storage_resizer_names() {
    let csi: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "c"}, "spec": {"csi": {"driver": "hostpath.csi.kvol.io", "volumeHandle": "h"}}
    }))
    .unwrap();
    let host: PersistentVolume =
        serde_json::from_value(json!({"metadata": {"name": "h"}, "spec": {"hostPath": {"path": "/x"}}}))
            .unwrap();
    let rows: &[(&str, VolumeSpec, Option<&str>)] = &[
        ("", VolumeSpec::persistent(ebs_pv("e")), Some("ebs.csi.aws.com")),
        ("", translate_spec(&VolumeSpec::persistent(ebs_pv("e"))).unwrap(), Some("ebs.csi.aws.com")),
        ("", VolumeSpec::persistent(rbd_pv("r")), Some("kubernetes.io/rbd")),
        ("CSIMigrationRBD=true", VolumeSpec::persistent(rbd_pv("r")), Some("rbd.csi.ceph.com")),
        ("", VolumeSpec::persistent(csi), Some("hostpath.csi.kvol.io")),
        ("", VolumeSpec::persistent(host), None),
    ];
    for (flag, spec, want) in rows {
        assert_eq!(storage_resizer(&gates(flag), spec).as_deref(), *want, "{flag:?} {spec}");
    }
}
