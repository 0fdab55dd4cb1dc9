//! Whether removing a component would orphan data: every object that still depends on it.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

use crate::definition::ComponentDefinition;

/// A snapshot object, as far as uninstalling cares (snapshot kinds are CRDs, not in k8s-openapi).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotObject {
    /// `VolumeSnapshot` or `VolumeSnapshotContent`.
    pub kind: &'static str,
    /// `namespace/name` for a VolumeSnapshot, `name` for a content.
    pub name: String,
    /// The CSI driver behind it (the content's `spec.driver`, or the snapshot's class's driver),
    /// when known.
    pub driver: Option<String>,
}

/// What exists, from the manifests or the API.
#[derive(Clone, Copy, Debug, Default)]
pub struct Inventory<'a> {
    pub volumes: &'a [PersistentVolume],
    pub claims: &'a [PersistentVolumeClaim],
    pub classes: &'a [StorageClass],
    pub snapshots: &'a [SnapshotObject],
}

/// One object that still depends on the component, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub kind: &'static str,
    pub name: String,
    pub why: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.kind, self.name, self.why)
    }
}

/// Every object whose data or progress depends on `component`: its driver's volumes (in-tree
/// ones that migrate to it counted whatever the gates say, since a gate can change later),
/// claims bound to them or waiting in a class it provisions, and its snapshots. A component
/// that provides snapshots but no driver is held by every snapshot object (their finalizers
/// need it). Empty means uninstalling orphans nothing.
pub fn holders(component: &ComponentDefinition, inventory: &Inventory) -> Vec<Holder> {
    let Some(driver) = component.provides.csi_driver.as_deref() else {
        if !component.provides.snapshots {
            return Vec::new();
        }
        return inventory
            .snapshots
            .iter()
            .map(|s| snapshot_holder(s, "its finalizers need the snapshot controller"))
            .collect();
    };
    let volumes: Vec<(&PersistentVolume, String)> =
        inventory.volumes.iter().filter_map(|pv| Some((pv, volume_reason(pv, driver)?))).collect();
    let mut found: Vec<Holder> = volumes
        .iter()
        .map(|(pv, why)| Holder { kind: "PersistentVolume", name: name(&pv.metadata), why: why.clone() })
        .collect();
    let held: Vec<String> = volumes.iter().map(|(pv, _)| name(&pv.metadata)).collect();
    found.extend(inventory.claims.iter().filter_map(|claim| {
        let why = claim_reason(claim, &held, inventory.classes, driver)?;
        Some(Holder { kind: "PersistentVolumeClaim", name: namespaced(&claim.metadata), why })
    }));
    found.extend(
        inventory
            .snapshots
            .iter()
            .filter(|s| s.driver.as_deref() == Some(driver))
            .map(|s| snapshot_holder(s, &format!("a snapshot of {driver}"))),
    );
    found
}

fn volume_reason(pv: &PersistentVolume, driver: &str) -> Option<String> {
    let spec = pv.spec.as_ref()?;
    if let Some(csi) = &spec.csi {
        return (csi.driver == driver).then(|| format!("a volume of {driver}"));
    }
    let plugin = kvol_translate::pv_in_tree_plugin(pv).ok()?;
    (plugin.csi_driver() == driver)
        .then(|| format!("an in-tree {} volume, which migrates to {driver}", plugin.in_tree_name()))
}

fn claim_reason(
    claim: &PersistentVolumeClaim,
    held: &[String],
    classes: &[StorageClass],
    driver: &str,
) -> Option<String> {
    let spec = claim.spec.as_ref()?;
    if let Some(volume) = spec.volume_name.as_deref().filter(|v| !v.is_empty()) {
        return held.iter().any(|h| h == volume).then(|| format!("bound to PersistentVolume {volume}"));
    }
    let class_name = spec.storage_class_name.as_deref()?;
    let class = classes.iter().find(|c| c.metadata.name.as_deref() == Some(class_name))?;
    provisioned_by(&class.provisioner, driver)
        .then(|| format!("waiting for a volume from class {class_name}, which {driver} provisions"))
}

/// Whether a class's provisioner is `driver`, directly or as the in-tree plugin migrating to it.
fn provisioned_by(provisioner: &str, driver: &str) -> bool {
    provisioner == driver
        || kvol_api::MigratablePlugin::from_in_tree_name(provisioner)
            .is_some_and(|p| p.csi_driver() == driver)
}

fn snapshot_holder(snapshot: &SnapshotObject, why: &str) -> Holder {
    Holder { kind: snapshot.kind, name: snapshot.name.clone(), why: why.to_string() }
}

fn name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

fn namespaced(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!("{}/{}", meta.namespace.as_deref().unwrap_or("default"), name(meta))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Catalogue;

    fn objects<T: serde::de::DeserializeOwned>(yaml: &str) -> Vec<T> {
        yaml.split("\n---\n")
            .map(|doc| serde_saphyr::from_str(doc).unwrap_or_else(|e| panic!("{doc}: {e}")))
            .collect()
    }

    const VOLUMES: &str = "\
metadata: {name: pv-lvm}
spec: {csi: {driver: lvm.csi.kvol.io, volumeHandle: v1}}
---
metadata: {name: pv-hostpath}
spec: {csi: {driver: hostpath.csi.kvol.io, volumeHandle: h1}}
---
metadata: {name: pv-gce}
spec: {gcePersistentDisk: {pdName: disk-1}}
---
metadata: {name: pv-nfs}
spec: {nfs: {server: nfs.example.com, path: /export}}";

    const CLAIMS: &str = "\
metadata: {name: data, namespace: app}
spec: {volumeName: pv-lvm}
---
metadata: {name: other, namespace: app}
spec: {volumeName: pv-hostpath}
---
metadata: {name: pending, namespace: app}
spec: {storageClassName: fast}
---
metadata: {name: pending-gce, namespace: app}
spec: {storageClassName: standard}
---
metadata: {name: classless, namespace: app}
spec: {}";

    const CLASSES: &str = "\
metadata: {name: fast}
provisioner: lvm.csi.kvol.io
---
metadata: {name: standard}
provisioner: kubernetes.io/gce-pd";

    fn held(component: &str, snapshots: &[SnapshotObject]) -> Vec<String> {
        let catalogue = Catalogue::built_in();
        let volumes = objects(VOLUMES);
        let claims = objects(CLAIMS);
        let classes = objects(CLASSES);
        let inventory = Inventory { volumes: &volumes, claims: &claims, classes: &classes, snapshots };
        holders(&catalogue.get(component).unwrap().definition, &inventory)
            .iter()
            .map(|h| h.to_string())
            .collect()
    }

    fn snapshot(kind: &'static str, name: &str, driver: Option<&str>) -> SnapshotObject {
        SnapshotObject { kind, name: name.into(), driver: driver.map(String::from) }
    }

    #[test]
    fn each_kind_of_holder() {
        let snapshots = [
            snapshot("VolumeSnapshotContent", "snapcontent-1", Some("lvm.csi.kvol.io")),
            snapshot("VolumeSnapshot", "app/snap-1", Some("hostpath.csi.kvol.io")),
        ];
        assert_eq!(
            held("lvm", &snapshots),
            [
                "PersistentVolume pv-lvm: a volume of lvm.csi.kvol.io",
                "PersistentVolumeClaim app/data: bound to PersistentVolume pv-lvm",
                "PersistentVolumeClaim app/pending: waiting for a volume from class fast, which lvm.csi.kvol.io provisions",
                "VolumeSnapshotContent snapcontent-1: a snapshot of lvm.csi.kvol.io",
            ]
        );
        assert_eq!(
            held("hostpath", &snapshots),
            [
                "PersistentVolume pv-hostpath: a volume of hostpath.csi.kvol.io",
                "PersistentVolumeClaim app/other: bound to PersistentVolume pv-hostpath",
                "VolumeSnapshot app/snap-1: a snapshot of hostpath.csi.kvol.io",
            ]
        );
        assert_eq!(
            held("snapshot-controller", &snapshots),
            [
                "VolumeSnapshotContent snapcontent-1: its finalizers need the snapshot controller",
                "VolumeSnapshot app/snap-1: its finalizers need the snapshot controller",
            ]
        );
        assert_eq!(held("snapshot-controller", &[]), Vec::<String>::new());
    }

    #[test]
    fn in_tree_volumes_count_for_the_driver_they_migrate_to() {
        let (catalogue, problems) = Catalogue::with_documents(vec![(
            crate::catalogue::Origin::BuiltIn("pd.yaml"),
            "name: gce-pd\nrole: driver\nprovides: {csiDriver: pd.csi.storage.gke.io}\n".into(),
        )]);
        assert!(problems.is_empty(), "{problems:?}");
        let volumes = objects(VOLUMES);
        let claims = objects(CLAIMS);
        let classes = objects(CLASSES);
        let inventory = Inventory { volumes: &volumes, claims: &claims, classes: &classes, snapshots: &[] };
        let found: Vec<String> = holders(&catalogue.get("gce-pd").unwrap().definition, &inventory)
            .iter()
            .map(|h| h.to_string())
            .collect();
        assert_eq!(
            found,
            [
                "PersistentVolume pv-gce: an in-tree kubernetes.io/gce-pd volume, which migrates to pd.csi.storage.gke.io",
                "PersistentVolumeClaim app/pending-gce: waiting for a volume from class standard, which pd.csi.storage.gke.io provisions",
            ]
        );
    }
}
