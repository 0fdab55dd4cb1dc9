//! Ceph RBD translation (`kubernetes.io/rbd` ↔ `rbd.csi.ceph.com`) as upstream had it until its 2024 removal.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, RBDPersistentVolumeSource,
    SecretReference, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvol_api::MigratablePlugin;
use kvol_api::keys::{PARAM_CSI_FSTYPE, PARAM_FSTYPE};
use md5::{Digest, Md5};

use super::Translator;
use crate::go::{key_is, zero_bool, zero_string};
use crate::{Result, TranslateError};

pub(crate) struct Rbd;

const PLUGIN: MigratablePlugin = MigratablePlugin::Rbd;
const DRIVER: &str = PLUGIN.csi_driver();

/// PV annotation carrying the CSI volume handle of a volume translated back to in-tree.
const ANN_VOLUME_HANDLE: &str = "rbd.csi.ceph.com/volume-handle";
/// Volume attributes, StorageClass parameters and (on PVs) breadcrumb annotations.
const CLUSTER_ID: &str = "clusterID";
const IMAGE_FEATURES: &str = "imageFeatures";
const IMAGE_FORMAT: &str = "imageFormat";
const IMAGE_NAME: &str = "imageName";
const JOURNAL_POOL: &str = "journalPool";
const POOL: &str = "pool";
const MONITORS: &str = "monitors";
const ADMIN_ID: &str = "adminId";
const STATIC_VOLUME: &str = "staticVolume";
const MIGRATION: &str = "migration";
const TRY_OTHER_MOUNTERS: &str = "tryOtherMounters";

const TRUE: &str = "true";
const DEFAULT_POOL: &str = "rbd";
const DEFAULT_IMAGE_FEATURES: &str = "layering";
const DEFAULT_ADMIN_USER: &str = "admin";
const DEFAULT_SECRET_NAMESPACE: &str = "default";
/// Prefix of images the in-tree provisioner created; left out of migration handles.
const DYNAMIC_IMAGE_PREFIX: &str = "kubernetes-dynamic-pvc-";

const PROVISIONER_SECRET_NAME: &str = "csi.storage.k8s.io/provisioner-secret-name";
const NODE_STAGE_SECRET_NAME: &str = "csi.storage.k8s.io/node-stage-secret-name";
const CONTROLLER_EXPAND_SECRET_NAME: &str = "csi.storage.k8s.io/controller-expand-secret-name";
const PROVISIONER_SECRET_NAMESPACE: &str = "csi.storage.k8s.io/provisioner-secret-namespace";
const NODE_STAGE_SECRET_NAMESPACE: &str = "csi.storage.k8s.io/node-stage-secret-namespace";
const CONTROLLER_EXPAND_SECRET_NAMESPACE: &str = "csi.storage.k8s.io/controller-expand-secret-namespace";

const RWO: &str = "ReadWriteOnce";
const ROX: &str = "ReadOnlyMany";

/// Appends the lower-case hex digits of `bytes` to `out`, as Go's `%x` and `hex.EncodeToString` do.
fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.reserve(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
}

/// The cluster ID upstream derives from a monitors string: its MD5 digest in hex.
fn cluster_id(monitors: &str) -> String {
    hex_digest(Md5::new_with_prefix(monitors))
}

/// [`cluster_id`] of the monitors joined with `,`, without building the joined string.
fn cluster_id_of_list(monitors: &[String]) -> String {
    let mut md5 = Md5::new();
    for (i, monitor) in monitors.iter().enumerate() {
        if i > 0 {
            md5.update(b",");
        }
        md5.update(monitor);
    }
    hex_digest(md5)
}

fn hex_digest(md5: Md5) -> String {
    let mut out = String::with_capacity(32);
    push_hex(&mut out, &md5.finalize());
    out
}

/// `mig_mons-<cluster id>_image-<image without the dynamic prefix>_<hex of pool>`.
fn migration_handle(cluster_id: &str, pool: &str, image: &str) -> String {
    let image = image.strip_prefix(DYNAMIC_IMAGE_PREFIX).unwrap_or(image);
    let mut out = String::with_capacity(22 + cluster_id.len() + image.len() + 2 * pool.len());
    out.push_str("mig_mons-");
    out.push_str(cluster_id);
    out.push_str("_image-");
    out.push_str(image);
    out.push('_');
    push_hex(&mut out, pool.as_bytes());
    out
}

fn access_mode(read_only: Option<bool>) -> Vec<String> {
    vec![if read_only == Some(true) { ROX } else { RWO }.to_string()]
}

fn name_of(meta: &ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

/// What an in-tree StorageClass parameter becomes; every other key is dropped.
enum Param {
    FsType,
    ImageFeatures,
    Pool,
    ImageFormat,
    AdminId,
    AdminSecretName,
    AdminSecretNamespace,
    Monitors,
}

fn classify(key: &str) -> Option<Param> {
    const TABLE: [(&str, Param); 8] = [
        (PARAM_FSTYPE, Param::FsType),
        ("imagefeatures", Param::ImageFeatures),
        (POOL, Param::Pool),
        ("imageformat", Param::ImageFormat),
        ("adminid", Param::AdminId),
        ("adminsecretname", Param::AdminSecretName),
        ("adminsecretnamespace", Param::AdminSecretNamespace),
        (MONITORS, Param::Monitors),
    ];
    TABLE.into_iter().find(|(lower, _)| key_is(key, lower)).map(|(_, param)| param)
}

fn translate_parameters(sc_name: &str, params: BTreeMap<String, String>) -> Result<BTreeMap<String, String>> {
    let mut out: BTreeMap<String, String> = [
        (MIGRATION, TRUE),
        (POOL, DEFAULT_POOL),
        (PROVISIONER_SECRET_NAMESPACE, DEFAULT_SECRET_NAMESPACE),
        (CONTROLLER_EXPAND_SECRET_NAMESPACE, DEFAULT_SECRET_NAMESPACE),
        (NODE_STAGE_SECRET_NAMESPACE, DEFAULT_SECRET_NAMESPACE),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut set = |key: &str, value: String| {
        out.insert(key.to_string(), value);
    };
    // Upstream walks a Go map, so when two spellings of one key (`pool` and `Pool`) are both
    // set the winner is random there. Here keys are walked in BTreeMap order (upper case sorts
    // first) and the last one written wins.
    for (key, value) in params {
        match classify(&key) {
            Some(Param::FsType) => set(PARAM_CSI_FSTYPE, value),
            Some(Param::ImageFeatures) => set(IMAGE_FEATURES, value),
            Some(Param::Pool) => set(POOL, value),
            Some(Param::ImageFormat) => set(IMAGE_FORMAT, value),
            Some(Param::AdminId) => set(ADMIN_ID, value),
            Some(Param::AdminSecretName) => {
                set(PROVISIONER_SECRET_NAME, value.clone());
                set(NODE_STAGE_SECRET_NAME, value.clone());
                set(CONTROLLER_EXPAND_SECRET_NAME, value);
            }
            Some(Param::AdminSecretNamespace) => {
                set(PROVISIONER_SECRET_NAMESPACE, value.clone());
                set(NODE_STAGE_SECRET_NAMESPACE, value.clone());
                set(CONTROLLER_EXPAND_SECRET_NAMESPACE, value);
            }
            Some(Param::Monitors) => {
                set(CLUSTER_ID, cluster_id(&value));
                set(MONITORS, value);
            }
            None => {}
        }
    }
    let missing = |key: &str| out.get(key).is_none_or(String::is_empty);
    if missing(PROVISIONER_SECRET_NAME) {
        return Err(TranslateError::plugin(
            PLUGIN,
            format!("storage class {sc_name:?}: missing ceph admin secret name (parameter adminSecretName)"),
        ));
    }
    if missing(MONITORS) {
        return Err(TranslateError::plugin(
            PLUGIN,
            format!("storage class {sc_name:?}: missing ceph monitors (parameter monitors)"),
        ));
    }
    Ok(out)
}

impl Translator for Rbd {
    fn storage_class_to_csi(&self, mut sc: StorageClass) -> Result<StorageClass> {
        let params = sc.parameters.take().unwrap_or_default();
        sc.parameters = Some(translate_parameters(name_of(&sc.metadata), params)?);
        sc.provisioner = DRIVER.to_string();
        Ok(sc)
    }

    fn inline_to_csi(&self, vol: &Volume, pod_namespace: &str) -> Result<PersistentVolume> {
        let Some(rbd) = vol.rbd.as_ref() else {
            return Err(TranslateError::plugin(
                PLUGIN,
                format!("inline volume {:?} has no rbd source", vol.name),
            ));
        };
        // Upstream always sets both secret references, to an empty one when the volume names
        // no secret; the secret is looked up in the pod's namespace.
        let secret = match &rbd.secret_ref {
            Some(local) => SecretReference {
                name: zero_string(Some(local.name.clone())),
                namespace: zero_string(Some(pod_namespace.to_string())),
            },
            None => SecretReference::default(),
        };
        let pool = rbd.pool.as_deref().filter(|p| !p.is_empty()).unwrap_or(DEFAULT_POOL);
        let attributes = BTreeMap::from([
            (CLUSTER_ID.to_string(), cluster_id_of_list(&rbd.monitors)),
            (POOL.to_string(), pool.to_string()),
            (STATIC_VOLUME.to_string(), TRUE.to_string()),
            (IMAGE_FEATURES.to_string(), DEFAULT_IMAGE_FEATURES.to_string()),
        ]);
        let mut name = String::with_capacity(DRIVER.len() + 1 + rbd.image.len());
        name.push_str(DRIVER);
        name.push('-');
        name.push_str(&rbd.image);
        Ok(PersistentVolume {
            metadata: ObjectMeta { name: Some(name), ..Default::default() },
            spec: Some(PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource {
                    driver: DRIVER.to_string(),
                    volume_handle: rbd.image.clone(),
                    fs_type: zero_string(rbd.fs_type.clone()),
                    volume_attributes: Some(attributes),
                    node_stage_secret_ref: Some(secret.clone()),
                    controller_expand_secret_ref: Some(secret),
                    ..Default::default()
                }),
                access_modes: Some(access_mode(rbd.read_only)),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn pv_to_csi(&self, pv: &mut PersistentVolume) -> Result<()> {
        let Some(rbd) = pv.spec.as_mut().and_then(|s| s.rbd.take()) else {
            return Err(TranslateError::plugin(
                PLUGIN,
                format!("persistent volume {:?} has no rbd source", name_of(&pv.metadata)),
            ));
        };
        let annotations = pv.metadata.annotations.as_ref();
        let annotation = |key: &str| annotations.and_then(|a| a.get(key)).map_or("", String::as_str);
        let pool = rbd.pool.unwrap_or_default();

        let mut attributes = BTreeMap::new();
        let handle = match annotation(ANN_VOLUME_HANDLE) {
            "" => {
                let cluster = cluster_id_of_list(&rbd.monitors);
                let handle = migration_handle(&cluster, &pool, &rbd.image);
                attributes.insert(STATIC_VOLUME.to_string(), TRUE.to_string());
                attributes.insert(CLUSTER_ID.to_string(), cluster);
                handle
            }
            handle => {
                attributes.insert(CLUSTER_ID.to_string(), annotation(CLUSTER_ID).to_string());
                handle.to_string()
            }
        };
        let features = match annotation(IMAGE_FEATURES) {
            "" => DEFAULT_IMAGE_FEATURES,
            features => features,
        };
        attributes.insert(IMAGE_FEATURES.to_string(), features.to_string());
        attributes.insert(IMAGE_FORMAT.to_string(), annotation(IMAGE_FORMAT).to_string());
        attributes.insert(JOURNAL_POOL.to_string(), annotation(JOURNAL_POOL).to_string());
        attributes.insert(IMAGE_NAME.to_string(), rbd.image);
        attributes.insert(POOL.to_string(), pool);
        attributes.insert(MIGRATION.to_string(), TRUE.to_string());
        attributes.insert(TRY_OTHER_MOUNTERS.to_string(), TRUE.to_string());

        let csi = CSIPersistentVolumeSource {
            driver: DRIVER.to_string(),
            volume_handle: handle,
            fs_type: zero_string(rbd.fs_type),
            volume_attributes: Some(attributes),
            node_stage_secret_ref: rbd.secret_ref.clone(),
            controller_expand_secret_ref: rbd.secret_ref,
            ..Default::default()
        };
        if let Some(spec) = pv.spec.as_mut() {
            spec.access_modes = Some(access_mode(rbd.read_only));
            spec.csi = Some(csi);
        }
        Ok(())
    }

    fn csi_pv_to_in_tree(&self, pv: &mut PersistentVolume) -> Result<()> {
        let Some(csi) = pv.spec.as_mut().and_then(|s| s.csi.take()) else {
            return Err(TranslateError::plugin(
                PLUGIN,
                format!("persistent volume {:?} has no csi source", name_of(&pv.metadata)),
            ));
        };
        // The attributes are dropped with the CSI source, so their values are moved, not copied.
        let mut attributes = csi.volume_attributes.unwrap_or_default();
        let mut take = |key: &str| attributes.remove(key).unwrap_or_default();
        let user = match take(ADMIN_ID) {
            user if user.is_empty() => DEFAULT_ADMIN_USER.to_string(),
            user => user,
        };
        let rbd = RBDPersistentVolumeSource {
            // Monitors cannot be recovered from the handle; upstream leaves one empty entry.
            monitors: vec![String::new()],
            image: take(IMAGE_NAME),
            pool: zero_string(Some(take(POOL))),
            user: Some(user),
            fs_type: zero_string(csi.fs_type),
            read_only: zero_bool(csi.read_only),
            secret_ref: csi.node_stage_secret_ref,
            keyring: None,
        };
        // Breadcrumbs for the next translation to CSI; the annotations map is created if absent.
        let annotations = pv.metadata.annotations.get_or_insert_default();
        annotations.insert(ANN_VOLUME_HANDLE.to_string(), csi.volume_handle);
        for key in [CLUSTER_ID, JOURNAL_POOL, IMAGE_FEATURES, IMAGE_FORMAT] {
            annotations.insert(key.to_string(), take(key));
        }
        if let Some(spec) = pv.spec.as_mut() {
            spec.rbd = Some(rbd);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::plugins::test_support::{Case, assert_same, check_result, pv, sc, vol};

    const IN_TREE: &str = "kubernetes.io/rbd";
    const IMAGE: &str = "kubernetes-dynamic-pvc-e4111eb6-4088-11ec-b823-0242ac110003";
    const HANDLE: &str = "mig_mons-b7f67366bb43f32e07d8a261a7840da9_image-e4111eb6-4088-11ec-b823-0242ac110003_7265706c696361706f6f6c";

    /// The parameters every translated class carries, overlaid with `extra`.
    fn with_defaults(extra: serde_json::Value) -> serde_json::Value {
        let mut params = json!({
            "migration": "true", "pool": "rbd",
            "csi.storage.k8s.io/provisioner-secret-namespace": "default",
            "csi.storage.k8s.io/controller-expand-secret-namespace": "default",
            "csi.storage.k8s.io/node-stage-secret-namespace": "default"});
        if let (serde_json::Value::Object(map), serde_json::Value::Object(extra)) = (&mut params, extra) {
            map.extend(extra);
        }
        params
    }

    /// From upstream TestTranslateRBDInTreeStorageClassToCSI (rbd_test.go before its removal),
    /// plus kvol cases. Upstream's "nil, err expected" case has no Rust counterpart.
    #[test]
    fn storage_class_to_csi() {
        let cases = [
            Case {
                name: "upstream: correct",
                input: json!({"provisioner": IN_TREE, "parameters": {
                    "adminId": "kubeadmin", "monitors": "10.70.53.126:6789,10.70.53.156:6789",
                    "pool": "replicapool", "adminSecretName": "ceph-admin-secret",
                    "adminSecretNamespace": "default"}}),
                want: Some(json!({"provisioner": "rbd.csi.ceph.com", "parameters": {
                    "adminId": "kubeadmin", "pool": "replicapool", "migration": "true",
                    "clusterID": "7982de6a23b77bce50b1ba9f2e879cce",
                    "monitors": "10.70.53.126:6789,10.70.53.156:6789",
                    "csi.storage.k8s.io/controller-expand-secret-name": "ceph-admin-secret",
                    "csi.storage.k8s.io/controller-expand-secret-namespace": "default",
                    "csi.storage.k8s.io/node-stage-secret-name": "ceph-admin-secret",
                    "csi.storage.k8s.io/node-stage-secret-namespace": "default",
                    "csi.storage.k8s.io/provisioner-secret-name": "ceph-admin-secret",
                    "csi.storage.k8s.io/provisioner-secret-namespace": "default"}})),
            },
            Case {
                name: "upstream: missing monitor",
                input: json!({"provisioner": IN_TREE, "parameters": {
                    "adminId": "kubeadmin", "monitors": "", "pool": "replicapool",
                    "adminSecretName": "ceph-admin-secret", "adminSecretNamespace": "default"}}),
                want: None,
            },
            Case {
                name: "upstream: monitor unavailable",
                input: json!({"provisioner": IN_TREE, "parameters": {
                    "adminId": "kubeadmin", "pool": "replicapool",
                    "adminSecretName": "ceph-admin-secret", "adminSecretNamespace": "default"}}),
                want: None,
            },
            Case {
                name: "upstream: admin secret unavailable",
                input: json!({"provisioner": IN_TREE, "parameters": {
                    "adminId": "kubeadmin", "pool": "replicapool",
                    "monitors": "10.70.53.126:6789,10.70.53.156:6789", "adminSecretNamespace": "default"}}),
                want: None,
            },
            Case { name: "no parameters", input: json!({"provisioner": IN_TREE}), want: None },
            Case {
                name: "empty admin secret name",
                input: json!({"parameters": {"monitors": "m", "adminSecretName": ""}}),
                want: None,
            },
            Case {
                name: "minimal: defaults fill the rest",
                input: json!({"metadata": {"name": "ceph"}, "provisioner": IN_TREE,
                    "reclaimPolicy": "Retain", "parameters": {"monitors": "m1", "adminSecretName": "s"}}),
                want: Some(json!({"metadata": {"name": "ceph"}, "provisioner": "rbd.csi.ceph.com",
                    "reclaimPolicy": "Retain", "parameters": with_defaults(json!({
                        "monitors": "m1", "clusterID": cluster_id("m1"),
                        "csi.storage.k8s.io/provisioner-secret-name": "s",
                        "csi.storage.k8s.io/node-stage-secret-name": "s",
                        "csi.storage.k8s.io/controller-expand-secret-name": "s"}))})),
            },
            Case {
                name: "keys renamed case-insensitively, unknown keys dropped",
                input: json!({"parameters": {
                    "MONITORS": "m1,m2", "AdminSecretName": "s", "AdminSecretNamespace": "ceph",
                    "FSType": "xfs", "ImageFeatures": "layering,exclusive-lock", "imageFormat": "2",
                    "ADMINID": "admin2", "userId": "kube", "userSecretName": "user-secret",
                    "userSecretNamespace": "x", "imagefeature": "typo"}}),
                want: Some(json!({"provisioner": "rbd.csi.ceph.com", "parameters": {
                    "migration": "true", "pool": "rbd",
                    "monitors": "m1,m2", "clusterID": cluster_id("m1,m2"),
                    "csi.storage.k8s.io/provisioner-secret-name": "s",
                    "csi.storage.k8s.io/node-stage-secret-name": "s",
                    "csi.storage.k8s.io/controller-expand-secret-name": "s",
                    "csi.storage.k8s.io/provisioner-secret-namespace": "ceph",
                    "csi.storage.k8s.io/node-stage-secret-namespace": "ceph",
                    "csi.storage.k8s.io/controller-expand-secret-namespace": "ceph",
                    "csi.storage.k8s.io/fstype": "xfs", "imageFeatures": "layering,exclusive-lock",
                    "imageFormat": "2", "adminId": "admin2"}})),
            },
            Case {
                // Random in upstream (Go map order); BTreeMap order here: `Pool` < `pool`.
                name: "two spellings of one key: the later in key order wins",
                input: json!({"parameters": {"monitors": "m", "adminSecretName": "s",
                    "Pool": "first", "pool": "second"}}),
                want: Some(json!({"provisioner": "rbd.csi.ceph.com", "parameters": with_defaults(json!({
                    "pool": "second", "monitors": "m", "clusterID": cluster_id("m"),
                    "csi.storage.k8s.io/provisioner-secret-name": "s",
                    "csi.storage.k8s.io/node-stage-secret-name": "s",
                    "csi.storage.k8s.io/controller-expand-secret-name": "s"}))})),
            },
        ];
        for case in cases {
            let input = sc(case.input);
            let got = crate::translate_in_tree_storage_class_to_csi(IN_TREE, &input);
            check_result(case.name, got, case.want.map(sc));
        }
    }

    #[test]
    fn storage_class_errors_name_the_class_and_parameter() {
        let input = sc(json!({"metadata": {"name": "ceph"}, "parameters": {"monitors": "m"}}));
        let err = crate::translate_in_tree_storage_class_to_csi(IN_TREE, &input).unwrap_err().to_string();
        assert!(err.contains("\"ceph\"") && err.contains("adminSecretName"), "{err}");
        let input = sc(json!({"metadata": {"name": "ceph"}, "parameters": {"adminSecretName": "s"}}));
        let err = crate::translate_in_tree_storage_class_to_csi(IN_TREE, &input).unwrap_err().to_string();
        assert!(err.contains("\"ceph\"") && err.contains("monitors"), "{err}");
    }

    /// From upstream TestTranslateRBDInTreeInlineVolumeToCSI, plus kvol cases. Through the
    /// public API the dispatcher also sets volumeMode Filesystem; upstream's "nil" case becomes
    /// an inline volume without an RBD source.
    #[test]
    fn inline_to_csi() {
        let cases = [
            Case {
                name: "upstream: normal",
                input: json!({"name": "rbdVol", "rbd": {
                    "monitors": ["10.70.53.126:6789,10.70.53.156:6789"], "pool": "replicapool",
                    "image": IMAGE, "user": "admin", "secretRef": {"name": "ceph-secret"},
                    "fsType": "ext4", "readOnly": false}}),
                want: Some(json!({"metadata": {"name": format!("rbd.csi.ceph.com-{IMAGE}")}, "spec": {
                    "csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": IMAGE, "fsType": "ext4",
                        "volumeAttributes": {"clusterID": "7982de6a23b77bce50b1ba9f2e879cce",
                            "imageFeatures": "layering", "pool": "replicapool", "staticVolume": "true"},
                        "nodeStageSecretRef": {"name": "ceph-secret", "namespace": "ns"},
                        "controllerExpandSecretRef": {"name": "ceph-secret", "namespace": "ns"}},
                    "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}})),
            },
            Case { name: "upstream: nil", input: json!({"name": "rbdVol"}), want: None },
            Case {
                name: "read-only, no pool, no secret: ROX, default pool, empty secret refs",
                input: json!({"name": "v", "rbd": {"monitors": ["m1", "m2"], "image": "img",
                    "pool": "", "readOnly": true}}),
                want: Some(json!({"metadata": {"name": "rbd.csi.ceph.com-img"}, "spec": {
                    "csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": "img",
                        "volumeAttributes": {"clusterID": cluster_id("m1,m2"),
                            "imageFeatures": "layering", "pool": "rbd", "staticVolume": "true"},
                        "nodeStageSecretRef": {}, "controllerExpandSecretRef": {}},
                    "accessModes": ["ReadOnlyMany"], "volumeMode": "Filesystem"}})),
            },
        ];
        for case in cases {
            let input = vol(case.input);
            let got = crate::translate_in_tree_inline_volume_to_csi(&input, "ns");
            check_result(case.name, got, case.want.map(pv));
        }
        // With no pod namespace and an unnamed secret the references exist but hold nothing,
        // as Go's JSON leaves their empty strings out; an empty fsType is left out too.
        let input = vol(json!({"name": "v", "rbd": {"monitors": ["m"], "image": "i", "fsType": "",
            "secretRef": {"name": ""}}}));
        let got = crate::translate_in_tree_inline_volume_to_csi(&input, "").expect("translates");
        let want = pv(json!({"metadata": {"name": "rbd.csi.ceph.com-i"}, "spec": {
            "csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": "i",
                "volumeAttributes": {"clusterID": cluster_id("m"), "imageFeatures": "layering",
                    "pool": "rbd", "staticVolume": "true"},
                "nodeStageSecretRef": {}, "controllerExpandSecretRef": {}},
            "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}}));
        assert_same("unnamed secret, no pod namespace", &got, &want);
    }

    #[test]
    fn inline_to_csi_secret_in_pod_namespace() {
        let input = vol(json!({"name": "v", "rbd": {"monitors": ["m"], "image": "i",
            "secretRef": {"name": "s"}}}));
        for (namespace, want) in
            [("team-a", json!({"name": "s", "namespace": "team-a"})), ("", json!({"name": "s"}))]
        {
            let got = crate::translate_in_tree_inline_volume_to_csi(&input, namespace).expect("translates");
            let csi = got.spec.and_then(|s| s.csi).expect("csi source");
            let want: SecretReference = serde_json::from_value(want).expect("secret reference");
            assert_eq!(csi.node_stage_secret_ref.as_ref(), Some(&want), "namespace {namespace:?}");
            assert_eq!(csi.controller_expand_secret_ref, Some(want), "namespace {namespace:?}");
        }
    }

    /// From upstream TestTranslateRBDInTreePVToCSI, plus kvol cases. Upstream's "nil PV" case
    /// has no Rust counterpart.
    #[test]
    fn pv_to_csi() {
        let secret = json!({"name": "ceph-secret", "namespace": "default"});
        let in_tree = |image: &str| {
            json!({"metadata": {"name": "rbd.csi.ceph.com"}, "spec": {
                "accessModes": ["ReadWriteOnce"],
                "claimRef": {"name": "test-pvc", "namespace": "default"},
                "rbd": {"monitors": ["10.70.53.126:6789"], "pool": "replicapool", "image": image,
                    "user": "admin", "fsType": "ext4", "readOnly": false, "secretRef": secret}}})
        };
        let csi = |image: &str| {
            json!({"metadata": {"name": "rbd.csi.ceph.com"}, "spec": {
                "accessModes": ["ReadWriteOnce"],
                "claimRef": {"name": "test-pvc", "namespace": "default"},
                "csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": HANDLE, "fsType": "ext4",
                    "volumeAttributes": {"clusterID": "b7f67366bb43f32e07d8a261a7840da9",
                        "imageFeatures": "layering", "imageFormat": "", "imageName": image,
                        "journalPool": "", "migration": "true", "pool": "replicapool",
                        "staticVolume": "true", "tryOtherMounters": "true"},
                    "nodeStageSecretRef": secret, "controllerExpandSecretRef": secret}}})
        };
        let short_image = IMAGE.trim_start_matches(DYNAMIC_IMAGE_PREFIX);
        let cases = [
            Case {
                name: "upstream: no RBD volume",
                input: json!({"metadata": {"name": "rbd.csi.ceph.com"}, "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "claimRef": {"name": "test-pvc", "namespace": "default"}}}),
                want: None,
            },
            Case { name: "upstream: normal", input: in_tree(IMAGE), want: Some(csi(IMAGE)) },
            Case {
                name: "upstream: normal-pvc-without-dynamic-provisioner-pfx-set",
                input: in_tree(short_image),
                want: Some(csi(short_image)),
            },
            Case {
                name: "handle annotation wins; breadcrumbs become attributes; ROX when read-only",
                input: json!({"metadata": {"name": "p", "annotations": {
                        "rbd.csi.ceph.com/volume-handle": "0001-0009-rook-ceph-0000000000000002-abc",
                        "clusterID": "rook-ceph", "imageFeatures": "layering,fast-diff",
                        "imageFormat": "2", "journalPool": "jp"}},
                    "spec": {"accessModes": ["ReadWriteOnce"],
                        "rbd": {"monitors": ["m1"], "image": "csi-vol-abc", "readOnly": true}}}),
                want: Some(json!({"metadata": {"name": "p", "annotations": {
                        "rbd.csi.ceph.com/volume-handle": "0001-0009-rook-ceph-0000000000000002-abc",
                        "clusterID": "rook-ceph", "imageFeatures": "layering,fast-diff",
                        "imageFormat": "2", "journalPool": "jp"}},
                    "spec": {"accessModes": ["ReadOnlyMany"],
                        "csi": {"driver": "rbd.csi.ceph.com",
                            "volumeHandle": "0001-0009-rook-ceph-0000000000000002-abc",
                            "volumeAttributes": {"clusterID": "rook-ceph",
                                "imageFeatures": "layering,fast-diff", "imageFormat": "2",
                                "imageName": "csi-vol-abc", "journalPool": "jp", "migration": "true",
                                "pool": "", "tryOtherMounters": "true"}}}})),
            },
            Case {
                name: "empty handle annotation: migration handle; no monitors, no pool",
                input: json!({"metadata": {"name": "p", "annotations": {
                        "rbd.csi.ceph.com/volume-handle": ""}},
                    "spec": {"rbd": {"monitors": [], "image": "img"}}}),
                want: Some(json!({"metadata": {"name": "p", "annotations": {
                        "rbd.csi.ceph.com/volume-handle": ""}},
                    "spec": {"accessModes": ["ReadWriteOnce"],
                        "csi": {"driver": "rbd.csi.ceph.com",
                            "volumeHandle": format!("mig_mons-{}_image-img_", cluster_id("")),
                            "volumeAttributes": {"clusterID": cluster_id(""),
                                "imageFeatures": "layering", "imageFormat": "",
                                "imageName": "img", "journalPool": "", "migration": "true",
                                "pool": "", "staticVolume": "true", "tryOtherMounters": "true"}}}})),
            },
        ];
        for case in cases {
            let input = pv(case.input);
            let before = input.clone();
            let got = crate::translate_in_tree_pv_to_csi(&input);
            assert_same(case.name, &input, &before);
            check_result(case.name, got, case.want.map(pv));
        }
    }

    /// From upstream TestTranslateCSIPvToInTree (rbd_test.go), plus kvol cases. Upstream's
    /// "nil PV" case has no Rust counterpart.
    #[test]
    fn csi_pv_to_in_tree() {
        let secret = json!({"name": "ceph-secret", "namespace": "default"});
        let cases = [
            Case {
                name: "upstream: no CSI section",
                input: json!({"metadata": {"name": "rbd.csi.ceph.com"}, "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "claimRef": {"name": "test-pvc", "namespace": "default"}}}),
                want: None,
            },
            Case {
                name: "upstream: normal",
                input: json!({"metadata": {"name": "rbd.csi.ceph.com"}, "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "claimRef": {"name": "test-pvc", "namespace": "default"},
                    "csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": "dummy", "readOnly": false,
                        "fsType": "ext4",
                        "volumeAttributes": {"clusterID": "b7f67366bb43f32e07d8a261a7840da9",
                            "imageFeatures": "layering", "imageFormat": "1", "imageName": IMAGE,
                            "journalPool": "some", "migration": "true", "pool": "replicapool",
                            "staticVolume": "true", "tryOtherMounters": "true"},
                        "nodeStageSecretRef": secret}}}),
                want: Some(json!({"metadata": {"name": "rbd.csi.ceph.com", "annotations": {
                        "clusterID": "b7f67366bb43f32e07d8a261a7840da9", "imageFeatures": "layering",
                        "imageFormat": "1", "journalPool": "some",
                        "rbd.csi.ceph.com/volume-handle": "dummy"}},
                    "spec": {"accessModes": ["ReadWriteOnce"],
                        "claimRef": {"name": "test-pvc", "namespace": "default"},
                        "rbd": {"monitors": [""], "pool": "replicapool", "image": IMAGE, "user": "admin",
                            "fsType": "ext4", "secretRef": secret}}})),
            },
            Case {
                name: "no attributes: empty image, no pool, user admin, existing annotations kept",
                input: json!({"metadata": {"name": "p", "annotations": {"keep": "me"}},
                    "spec": {"csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": "h", "readOnly": true,
                        "controllerExpandSecretRef": secret}}}),
                want: Some(json!({"metadata": {"name": "p", "annotations": {"keep": "me",
                        "clusterID": "", "imageFeatures": "", "imageFormat": "", "journalPool": "",
                        "rbd.csi.ceph.com/volume-handle": "h"}},
                    "spec": {"rbd": {"monitors": [""], "image": "", "user": "admin", "readOnly": true}}})),
            },
            Case {
                name: "adminId attribute becomes the user",
                input: json!({"metadata": {"name": "p"}, "spec": {"csi": {"driver": "rbd.csi.ceph.com",
                    "volumeHandle": "h", "volumeAttributes": {"adminId": "kubeadmin", "imageName": "i"}}}}),
                want: Some(json!({"metadata": {"name": "p", "annotations": {
                        "clusterID": "", "imageFeatures": "", "imageFormat": "", "journalPool": "",
                        "rbd.csi.ceph.com/volume-handle": "h"}},
                    "spec": {"rbd": {"monitors": [""], "image": "i", "user": "kubeadmin"}}})),
            },
        ];
        for case in cases {
            let input = pv(case.input);
            let got = crate::translate_csi_pv_to_in_tree(&input);
            check_result(case.name, got, case.want.map(pv));
        }
    }

    /// The breadcrumbs of a CSI → in-tree translation bring the same handle back.
    #[test]
    fn breadcrumbs_round_trip() {
        let csi = pv(json!({"metadata": {"name": "p"}, "spec": {"accessModes": ["ReadWriteOnce"],
            "csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": "0001-abc", "fsType": "ext4",
                "volumeAttributes": {"clusterID": "c1", "imageFeatures": "layering", "imageFormat": "2",
                    "imageName": "csi-vol-abc", "journalPool": "jp", "migration": "true",
                    "pool": "replicapool", "tryOtherMounters": "true"},
                "nodeStageSecretRef": {"name": "s", "namespace": "n"},
                "controllerExpandSecretRef": {"name": "s", "namespace": "n"}}}}));
        let in_tree = crate::translate_csi_pv_to_in_tree(&csi).expect("to in-tree");
        let mut back = crate::translate_in_tree_pv_to_csi(&in_tree).expect("back to csi");
        back.metadata.annotations = None;
        assert_same("round trip", &back, &csi);
    }

    #[test]
    fn migration_handle_format() {
        // The example in upstream's composeMigVolID comment is for pool "replicapool".
        assert_eq!(
            migration_handle("afcca55bc1bdd3f479be1e8281c13ab1", "replicapool", IMAGE),
            "mig_mons-afcca55bc1bdd3f479be1e8281c13ab1_image-e4111eb6-4088-11ec-b823-0242ac110003_7265706c696361706f6f6c"
        );
        // Only a leading prefix is removed, and only once.
        assert_eq!(
            migration_handle("c", "", "x-kubernetes-dynamic-pvc-1"),
            "mig_mons-c_image-x-kubernetes-dynamic-pvc-1_"
        );
        assert_eq!(
            migration_handle("c", "p", "kubernetes-dynamic-pvc-kubernetes-dynamic-pvc-1"),
            "mig_mons-c_image-kubernetes-dynamic-pvc-1_70"
        );
        assert_eq!(cluster_id("10.70.53.126:6789"), "b7f67366bb43f32e07d8a261a7840da9");
        assert_eq!(cluster_id(""), "d41d8cd98f00b204e9800998ecf8427e");
        let list = |l: &[&str]| cluster_id_of_list(&l.iter().map(|m| m.to_string()).collect::<Vec<_>>());
        assert_eq!(list(&["10.70.53.126:6789", "10.70.53.156:6789"]), "7982de6a23b77bce50b1ba9f2e879cce");
        assert_eq!(list(&["a", "", "b"]), cluster_id("a,,b"));
        assert_eq!(list(&[""]), cluster_id(""));
        assert_eq!(list(&[]), cluster_id(""));
        let mut hex = String::new();
        push_hex(&mut hex, &[0x00, 0x0f, 0xa5, 0xff]);
        assert_eq!(hex, "000fa5ff");
    }

    /// From upstream TestTranslateInTreeInlineVolumeToCSINameUniqueness and
    /// TestPluginNameMappings ("RBD plugin name") in translate_test.go.
    #[test]
    fn names_and_uniqueness() {
        let a = vol(json!({"name": "a", "rbd": {"monitors": [], "image": "0f6d1c9e-1"}}));
        let b = vol(json!({"name": "a", "rbd": {"monitors": [], "image": "0f6d1c9e-2"}}));
        let pa = crate::translate_in_tree_inline_volume_to_csi(&a, "").expect("a");
        let pb = crate::translate_in_tree_inline_volume_to_csi(&b, "").expect("b");
        assert_ne!(pa.metadata.name, pb.metadata.name);

        assert_eq!(crate::csi_name_from_in_tree_name(IN_TREE), Ok("rbd.csi.ceph.com"));
        assert!(crate::is_migrated_csi_driver_by_name("rbd.csi.ceph.com"));
        assert_eq!(crate::in_tree_name_from_csi_name("rbd.csi.ceph.com"), Ok(IN_TREE));
        assert!(crate::is_migratable_in_tree_plugin_by_name(IN_TREE));
        assert_eq!(crate::repair_volume_handle("rbd.csi.ceph.com", "h", "n").as_deref(), Ok("h"));
    }

    #[test]
    fn key_is_follows_go_to_lower() {
        assert!(key_is("AdminSecretName", "adminsecretname"));
        assert!(key_is("\u{130}mageformat", "imageformat"));
        assert!(!key_is("adminsecretnamespace", "adminsecretname"));
        assert!(!key_is("adminsecretnam", "adminsecretname"));
        assert!(matches!(classify("MONITORS"), Some(Param::Monitors)));
        assert!(matches!(classify("FsType"), Some(Param::FsType)));
        assert!(classify("userSecretName").is_none());
    }
}
