//! Fuzzes every translation entry point with generated specs: none may panic, and results keep
//! the invariants callers rely on.
#![no_main]

use arbitrary::{Result, Unstructured};
use k8s_openapi::api::core::v1::{PersistentVolume, Volume};
use k8s_openapi::api::storage::v1::StorageClass;
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};

/// Strings that matter to the translators, mixed with arbitrary ones.
const WORDS: &[&str] = &[
    "", " ", "__", "a__b", "us-east-1a", "us-west-2-lax-1a", "us-east-1-wl1-bos-wlz-1", "us-central1-c",
    "europe-west1", "0", "1", "12", "-", "--", "a-b", "a-b-c-d", "aws://us-east-1a/vol-1", "aws:///vol-2",
    "aws://x/", "vol-", "projects/p/zones/z/disks/d", "projects/UNSPECIFIED/regions/UNSPECIFIED/disks/d",
    "projects/p/zones/z/instances/n", "a/b/c", "#", "a#b", "rg#acct#share#name#ns", "##", "#####",
    "azure-storage-account-x-secret", "azure-storage-account--secret", "http://h/vhds/x", "HTTP://",
    "/subscriptions/1/resourceGroups/r/providers/Microsoft.Compute/disks/d", "Managed", "managed",
    "Shared", "Dedicated", "None", "ReadOnly", "[ds] a/b.vmdk", "kubernetes-dynamic-pvc-x", "é", "\u{0}",
    "topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone", "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/region", "topology.ebs.csi.aws.com/zone", "topology.gke.io/zone",
    "topology.disk.csi.azure.com/zone", "topology.cinder.csi.openstack.org/zone", "topology.csi.vmware.com/zone",
    "topology.csi.vmware.com/region", "partition", "fstype", "FSType", "zone", "zones", "iopspergb",
    "datastore", "storagepolicyname", "cachingmode", "kind", "sharename", "secretname", "secretnamespace",
    "initialvolumefilepath", "openstorage.io/auth-secret-name", "openstorage.io/auth-secret-namespace",
    "monitors", "adminsecretname", "adminsecretnamespace", "pool", "imagefeatures", "clusterID",
    "rbd.csi.ceph.com/volume-handle", "kubernetes.io/azure-file-resource-group", "ReadWriteOnce",
    "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod",
];

const DRIVERS: &[&str] = &[
    "ebs.csi.aws.com", "pd.csi.storage.gke.io", "disk.csi.azure.com", "file.csi.azure.com",
    "cinder.csi.openstack.org", "csi.vsphere.vmware.com", "pxd.portworx.com", "rbd.csi.ceph.com", "other",
];

const IN_TREE: &[&str] = &[
    "kubernetes.io/aws-ebs", "kubernetes.io/gce-pd", "kubernetes.io/azure-disk", "kubernetes.io/azure-file",
    "kubernetes.io/cinder", "kubernetes.io/vsphere-volume", "kubernetes.io/portworx-volume", "kubernetes.io/rbd",
    "kubernetes.io/nfs",
];

fn word(u: &mut Unstructured) -> Result<String> {
    if u.ratio(3, 4)? { Ok(u.choose(WORDS)?.to_string()) } else { u.arbitrary() }
}

fn opt(u: &mut Unstructured, m: &mut Map<String, Value>, key: &str, v: impl FnOnce(&mut Unstructured) -> Result<Value>) -> Result<()> {
    if u.arbitrary()? {
        m.insert(key.to_string(), v(u)?);
    }
    Ok(())
}

fn string_map(u: &mut Unstructured) -> Result<Value> {
    let mut m = Map::new();
    for _ in 0..u.int_in_range(0..=4)? {
        m.insert(word(u)?, Value::String(word(u)?));
    }
    Ok(Value::Object(m))
}

fn strings(u: &mut Unstructured) -> Result<Value> {
    let mut v = Vec::new();
    for _ in 0..u.int_in_range(0..=3)? {
        v.push(Value::String(word(u)?));
    }
    Ok(Value::Array(v))
}

/// One in-tree source (field name, body) with arbitrary field values.
fn source(u: &mut Unstructured) -> Result<(&'static str, Value)> {
    let s = |u: &mut Unstructured| word(u).map(Value::String);
    let b = |u: &mut Unstructured| u.arbitrary::<bool>().map(Value::Bool);
    let mut m = Map::new();
    let field = match u.int_in_range(0..=7)? {
        0 => {
            m.insert("volumeID".into(), s(u)?);
            opt(u, &mut m, "partition", |u| Ok(json!(u.int_in_range(-3..=300)?)))?;
            "awsElasticBlockStore"
        }
        1 => {
            m.insert("pdName".into(), s(u)?);
            opt(u, &mut m, "partition", |u| Ok(json!(u.int_in_range(-3..=300)?)))?;
            "gcePersistentDisk"
        }
        2 => {
            m.insert("diskName".into(), s(u)?);
            m.insert("diskURI".into(), s(u)?);
            opt(u, &mut m, "kind", s)?;
            opt(u, &mut m, "cachingMode", s)?;
            "azureDisk"
        }
        3 => {
            m.insert("secretName".into(), s(u)?);
            m.insert("shareName".into(), s(u)?);
            opt(u, &mut m, "secretNamespace", s)?;
            "azureFile"
        }
        4 => {
            m.insert("volumeID".into(), s(u)?);
            "cinder"
        }
        5 => {
            m.insert("volumePath".into(), s(u)?);
            opt(u, &mut m, "storagePolicyName", s)?;
            "vsphereVolume"
        }
        6 => {
            m.insert("volumeID".into(), s(u)?);
            "portworxVolume"
        }
        _ => {
            m.insert("monitors".into(), strings(u)?);
            m.insert("image".into(), s(u)?);
            opt(u, &mut m, "pool", s)?;
            opt(u, &mut m, "secretRef", |u| Ok(json!({"name": word(u)?, "namespace": word(u)?})))?;
            "rbd"
        }
    };
    opt(u, &mut m, "fsType", s)?;
    opt(u, &mut m, "readOnly", b)?;
    Ok((field, Value::Object(m)))
}

fn node_affinity(u: &mut Unstructured) -> Result<Value> {
    let mut terms = Vec::new();
    for _ in 0..u.int_in_range(0..=3)? {
        let mut exprs = Vec::new();
        for _ in 0..u.int_in_range(0..=3)? {
            exprs.push(json!({"key": word(u)?, "operator": "In", "values": strings(u)?}));
        }
        terms.push(json!({"matchExpressions": exprs}));
    }
    Ok(json!({"required": {"nodeSelectorTerms": terms}}))
}

fn metadata(u: &mut Unstructured) -> Result<Value> {
    let mut m = Map::new();
    m.insert("name".into(), Value::String(word(u)?));
    opt(u, &mut m, "labels", string_map)?;
    opt(u, &mut m, "annotations", string_map)?;
    Ok(Value::Object(m))
}

fn pv_spec(u: &mut Unstructured, sources: &mut dyn FnMut(&mut Unstructured, &mut Map<String, Value>) -> Result<()>) -> Result<Value> {
    let mut spec = Map::new();
    sources(u, &mut spec)?;
    opt(u, &mut spec, "accessModes", strings)?;
    opt(u, &mut spec, "nodeAffinity", node_affinity)?;
    opt(u, &mut spec, "claimRef", |u| Ok(json!({"namespace": word(u)?, "name": word(u)?})))?;
    Ok(Value::Object(spec))
}

fn check(u: &mut Unstructured) -> Result<()> {
    // In-tree PV (sometimes with two sources) → CSI.
    let spec = pv_spec(u, &mut |u, spec| {
        for _ in 0..if u.ratio(1, 10)? { 2 } else { 1 } {
            let (field, body) = source(u)?;
            spec.insert(field.into(), body);
        }
        Ok(())
    })?;
    let pv_json = json!({"metadata": metadata(u)?, "spec": spec});
    if let Ok(pv) = serde_json::from_value::<PersistentVolume>(pv_json) {
        let before = pv.clone();
        if let Ok(out) = kvol_translate::translate_in_tree_pv_to_csi(&pv) {
            let spec = out.spec.as_ref().expect("a translated PV has a spec");
            assert!(spec.csi.is_some(), "a translated PV has a CSI source");
            assert_eq!(kvol_translate::pv_sources(&out).len(), 1, "only the CSI source is left");
            let _ = kvol_translate::translate_csi_pv_to_in_tree(&out);
        }
        assert_eq!(pv, before, "input was mutated");
        let _ = kvol_translate::is_pv_migratable(&pv);
    }
    // Inline volume → CSI.
    let (field, body) = source(u)?;
    let vol_json = json!({"name": word(u)?, field: body});
    if let Ok(vol) = serde_json::from_value::<Volume>(vol_json) {
        if let Ok(out) = kvol_translate::translate_in_tree_inline_volume_to_csi(&vol, &word(u)?) {
            let spec = out.spec.as_ref().expect("a translated inline volume has a spec");
            assert!(spec.csi.is_some() && spec.volume_mode.is_some());
        }
    }
    // StorageClass → CSI.
    let mut sc = Map::new();
    sc.insert("metadata".into(), json!({"name": "sc"}));
    sc.insert("provisioner".into(), Value::String(u.choose(IN_TREE)?.to_string()));
    opt(u, &mut sc, "parameters", string_map)?;
    opt(u, &mut sc, "allowedTopologies", |u| {
        let mut terms = Vec::new();
        for _ in 0..u.int_in_range(0..=2)? {
            terms.push(json!({"matchLabelExpressions": [{"key": word(u)?, "values": strings(u)?}]}));
        }
        Ok(Value::Array(terms))
    })?;
    if let Ok(sc) = serde_json::from_value::<StorageClass>(Value::Object(sc)) {
        let _ = kvol_translate::translate_in_tree_storage_class_to_csi(&sc.provisioner.clone(), &sc);
    }
    // CSI PV → in-tree, and handle repair.
    let driver = u.choose(DRIVERS)?.to_string();
    let handle = word(u)?;
    let mut csi = Map::new();
    csi.insert("driver".into(), Value::String(driver.clone()));
    csi.insert("volumeHandle".into(), Value::String(handle.clone()));
    opt(u, &mut csi, "volumeAttributes", string_map)?;
    opt(u, &mut csi, "fsType", |u| word(u).map(Value::String))?;
    opt(u, &mut csi, "nodeStageSecretRef", |u| Ok(json!({"name": word(u)?, "namespace": word(u)?})))?;
    let spec = pv_spec(u, &mut |_, spec| {
        spec.insert("csi".into(), Value::Object(csi.clone()));
        Ok(())
    })?;
    if let Ok(pv) = serde_json::from_value::<PersistentVolume>(json!({"metadata": metadata(u)?, "spec": spec})) {
        if let Ok(out) = kvol_translate::translate_csi_pv_to_in_tree(&pv) {
            assert!(out.spec.as_ref().is_some_and(|s| s.csi.is_none()), "the CSI source is gone");
        }
    }
    let _ = kvol_translate::repair_volume_handle(&driver, &handle, &word(u)?);
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let _ = check(&mut u);
});
