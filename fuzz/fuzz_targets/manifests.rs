//! Fuzzes the manifests reader: YAML or JSON text into objects, validation and the desired state; nothing may panic, and every object that passes validation names only safe path segments.
#![no_main]

use kvol_node::desired::desired_state;
use kvol_node::model::ObjectSet;
use kvol_node::source::{Object, parse_manifests};
use kvol_plugin::beneath::check_segment;
use libfuzzer_sys::fuzz_target;

fn safe(what: &str, segment: &str) {
    if let Err(reason) = check_segment(segment) {
        panic!("a validated {what} {segment:?} is not a safe path segment: {reason}");
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (objects, problems) = parse_manifests("fuzz.yaml", text);
    for problem in &problems {
        assert!(!problem.reason.is_empty(), "a problem without a reason: {problem:?}");
    }
    let mut set = ObjectSet::default();
    for object in objects {
        let key = object.key();
        match object {
            Object::Pod(pod) => {
                safe("pod name", pod.metadata.name.as_deref().unwrap_or_default());
                safe("pod uid", pod.metadata.uid.as_deref().unwrap_or_default());
                for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
                    safe("volume name", &volume.name);
                }
                set.pods.insert(key, *pod);
            }
            Object::PersistentVolume(pv) => {
                safe("persistent volume name", pv.metadata.name.as_deref().unwrap_or_default());
                set.persistent_volumes.insert(key, *pv);
            }
            Object::PersistentVolumeClaim(claim) => {
                set.claims.insert(key, *claim);
            }
            Object::StorageClass(class) => {
                set.storage_classes.insert(key, *class);
            }
            Object::CsiDriver(driver) => {
                safe("csi driver name", driver.metadata.name.as_deref().unwrap_or_default());
                set.csi_drivers.insert(key, *driver);
            }
            Object::Secret(secret) => {
                set.secrets.insert(key, *secret);
            }
        }
    }
    let _ = desired_state(&set, "node-a");
});
