//! Which provisioned volumes to grow because their claim asks for more, in standalone mode (the external-resizer's job); pure.
//!
//! A claim whose `resources.requests.storage` grew past its provisioned volume's capacity, of a
//! StorageClass with `allowVolumeExpansion: true`, is grown through its driver's
//! `ControllerExpandVolume`; the volume's record then carries the new capacity, and the node
//! grows the filesystem (`kvol-node`'s `reconciler::expansions`). A claim asking for less than
//! its volume has, or whose class does not allow expansion, is refused with a problem line, as
//! the API server refuses such an edit in a cluster.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use kvol_api::ObjectSet;
use kvol_api::quantity::parse_bytes;

/// A volume to grow: the claim, its volume's driver and handle, and the sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpandRequest {
    pub claim_key: String,
    pub pv_name: String,
    pub driver: String,
    pub volume_handle: String,
    pub from: u64,
    pub to: u64,
}

/// The provisioned volumes to grow, and why other claims' edits are refused. Pure.
pub fn claims_to_expand(
    objects: &ObjectSet,
    provisioned: &BTreeMap<String, Arc<PersistentVolume>>,
) -> (Vec<ExpandRequest>, Vec<String>) {
    let (mut requests, mut problems) = (Vec::new(), Vec::new());
    for (claim_key, pv) in provisioned {
        let Some(claim) = objects.claims.get(claim_key) else { continue };
        let spec = claim.spec.as_ref();
        let asked = spec
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .and_then(|q| parse_bytes(&q.0).ok());
        let (Some(asked), Some(has)) = (asked, capacity(pv)) else { continue };
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        if asked < has {
            problems.push(format!(
                "persistentvolumeclaim {claim_key} asks for {asked} bytes, less than its volume {pv_name} has \
                 ({has} bytes): volumes do not shrink"
            ));
            continue;
        }
        if asked == has {
            continue;
        }
        let class_name = spec.and_then(|s| s.storage_class_name.as_deref()).unwrap_or_default();
        let allowed =
            objects.storage_classes.get(class_name).and_then(|c| c.allow_volume_expansion) == Some(true);
        if !allowed {
            problems.push(format!(
                "persistentvolumeclaim {claim_key} asks for {asked} bytes, more than its volume {pv_name} has \
                 ({has} bytes), but its storageclass {class_name:?} does not allow volume expansion"
            ));
            continue;
        }
        let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else { continue };
        requests.push(ExpandRequest {
            claim_key: claim_key.clone(),
            pv_name,
            driver: csi.driver.clone(),
            volume_handle: csi.volume_handle.clone(),
            from: has,
            to: asked,
        });
    }
    (requests, problems)
}

/// The requests to carry out now, and why the others wait: a volume whose driver grows
/// volumes offline only (`offline_only`, as its `GetPluginCapabilities` says) is not grown
/// while the node uses it (`in_use`: unique volume names, which end in `<driver>^<handle>`),
/// as the external-resizer refuses an in-use volume of such a driver. Pure.
pub fn offline_waits(
    requests: Vec<ExpandRequest>,
    offline_only: &[&str],
    in_use: &[&str],
) -> (Vec<ExpandRequest>, Vec<String>) {
    let mut waiting = Vec::new();
    let now = requests
        .into_iter()
        .filter(|r| {
            let unique = format!("{}^{}", r.driver, r.volume_handle);
            let wait =
                offline_only.contains(&r.driver.as_str()) && in_use.iter().any(|u| u.ends_with(&unique));
            if wait {
                waiting.push(format!(
                    "persistentvolumeclaim {} waits to grow to {} bytes: csi driver {} grows volumes offline \
                     only, and volume {} is in use on this node (stop its pods)",
                    r.claim_key, r.to, r.driver, r.pv_name
                ));
            }
            !wait
        })
        .collect();
    (now, waiting)
}

/// A PersistentVolume's capacity in bytes.
pub fn capacity(pv: &PersistentVolume) -> Option<u64> {
    let quantity = pv.spec.as_ref()?.capacity.as_ref()?.get("storage")?;
    parse_bytes(&quantity.0).ok()
}

/// `pv` with its capacity set to `bytes`.
pub fn with_capacity(pv: &PersistentVolume, bytes: u64) -> PersistentVolume {
    let mut pv = pv.clone();
    let quantity = k8s_openapi::apimachinery::pkg::api::resource::Quantity(bytes.to_string());
    pv.spec
        .get_or_insert_with(Default::default)
        .capacity
        .get_or_insert_with(Default::default)
        .insert("storage".into(), quantity);
    pv
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml<T: serde::de::DeserializeOwned>(text: &str) -> T {
        serde_json::from_value(serde_saphyr::from_str::<serde_json::Value>(text).unwrap()).unwrap()
    }

    #[test]
    fn grown_claims_are_expanded_where_their_class_allows_it() {
        // (what, the claim's request, its class, want requests "from→to", want problems' start)
        type Case =
            (&'static str, &'static str, &'static str, &'static [&'static str], &'static [&'static str]);
        let cases: &[Case] = &[
            ("grown, allowed", "32Mi", "grows", &["16777216->33554432"], &[]),
            ("unchanged", "16Mi", "grows", &[], &[]),
            (
                "shrunk: refused",
                "8Mi",
                "grows",
                &[],
                &["persistentvolumeclaim default/c asks for 8388608 bytes, less than"],
            ),
            (
                "grown, class without expansion: refused",
                "32Mi",
                "fixed",
                &[],
                &[
                    "persistentvolumeclaim default/c asks for 33554432 bytes, more than its volume pv-c has (16777216 bytes), but its storageclass \"fixed\" does not allow",
                ],
            ),
            (
                "grown, class unknown: refused",
                "32Mi",
                "nope",
                &[],
                &["persistentvolumeclaim default/c asks for 33554432 bytes"],
            ),
        ];
        for (what, request, class, want, want_problems) in cases {
            let mut objects = ObjectSet::default();
            objects.storage_classes.insert(
                "grows".into(),
                yaml("metadata: {name: grows}\nprovisioner: d\nallowVolumeExpansion: true"),
            );
            objects.storage_classes.insert("fixed".into(), yaml("metadata: {name: fixed}\nprovisioner: d"));
            objects.claims.insert(
                "default/c".into(),
                yaml(&format!("metadata: {{name: c, namespace: default}}\nspec: {{storageClassName: {class}, resources: {{requests: {{storage: {request}}}}}}}")),
            );
            let pv: PersistentVolume = yaml(
                "metadata: {name: pv-c}\nspec: {capacity: {storage: 16Mi}, csi: {driver: d, volumeHandle: h1}}",
            );
            let records = BTreeMap::from([("default/c".to_string(), Arc::new(pv))]);
            let (requests, problems) = claims_to_expand(&objects, &records);
            let got: Vec<String> = requests.iter().map(|r| format!("{}->{}", r.from, r.to)).collect();
            assert_eq!(got, *want, "{what}");
            assert_eq!(problems.len(), want_problems.len(), "{what}: {problems:?}");
            for (p, w) in problems.iter().zip(want_problems.iter()) {
                assert!(p.starts_with(w), "{what}: {p}");
            }
            if let Some(r) = requests.first() {
                assert_eq!(
                    (r.driver.as_str(), r.volume_handle.as_str(), r.pv_name.as_str()),
                    ("d", "h1", "pv-c")
                );
            }
        }
        let pv: PersistentVolume = yaml("metadata: {name: p}\nspec: {capacity: {storage: 1Gi}}");
        assert_eq!(capacity(&with_capacity(&pv, 2 << 30)), Some(2 << 30));
    }

    #[test]
    fn a_volume_of_an_offline_only_driver_waits_while_in_use() {
        let request = |driver: &str| ExpandRequest {
            claim_key: "default/c".into(),
            pv_name: "pv-c".into(),
            driver: driver.into(),
            volume_handle: "h1".into(),
            from: 1,
            to: 2,
        };
        // (what, driver, offline-only drivers, in use, carried out now)
        type Case = (&'static str, &'static str, &'static [&'static str], &'static [&'static str], bool);
        let cases: &[Case] = &[
            ("online driver, in use", "d", &[], &["kubernetes.io/csi/d^h1"], true),
            ("offline driver, in use", "d", &["d"], &["kubernetes.io/csi/d^h1"], false),
            ("offline driver, not in use", "d", &["d"], &["kubernetes.io/csi/d^h2"], true),
            ("another driver offline", "d", &["e"], &["kubernetes.io/csi/d^h1"], true),
        ];
        for (what, driver, offline, in_use, now) in cases {
            let (go, waiting) = offline_waits(vec![request(driver)], offline, in_use);
            assert_eq!(go.len() == 1, *now, "{what}");
            assert_eq!(waiting.len() == 1, !*now, "{what}");
            if let Some(w) = waiting.first() {
                assert!(w.contains("offline only") && w.contains("pv-c"), "{what}: {w}");
            }
        }
        let pv: PersistentVolume = yaml("metadata: {name: p}\nspec: {capacity: {storage: 1Gi}}");
        assert_eq!(capacity(&with_capacity(&pv, 2 << 30)), Some(2 << 30));
    }
}
