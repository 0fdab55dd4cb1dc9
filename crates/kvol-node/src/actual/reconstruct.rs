//! Reconstruction: pod volume directories and staged CSI volumes the node has but no record accounts for, attributed to their plugin as uncertain records, so they are torn down (or published again) through that plugin; pure.
//!
//! Kubelet does the same on start (`reconstructVolume`): a directory under
//! `pods/<uid>/volumes/<plugin dir>/<volume>` names its plugin, and CSI volumes carry a
//! `vol_data.json` beside their mount that names the driver and the volume handle. kvol also
//! does it while it runs, for directories of pods no longer wanted (a driver that finished a
//! publish after the agent gave up on it). What cannot be attributed is left alone and reported.

use std::path::Path;
#[cfg(test)]
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, CSIVolumeSource, EmptyDirVolumeSource, FlexVolumeSource, HostPathVolumeSource,
    LocalVolumeSource, PersistentVolume, PersistentVolumeSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvol_csi::paths::{CSI_PLUGIN_NAME, VolData};
use kvol_plugin::VolumeSpec;
use kvol_plugin::plugin::PodInfo;

pub use crate::actual::observe::VolDataRead;
use crate::actual::observe::{NodeObservation, PodVolumeDir};
use crate::model::{ActualState, PodVolumeKey, PublishedVolume, StagedVolume, unique_volume_name};

/// The compiled-in plugins whose pod volume directories kvol knows.
const COMPILED_IN: [&str; 7] = [
    "kubernetes.io/empty-dir",
    "kubernetes.io/host-path",
    "kubernetes.io/local-volume",
    "kubernetes.io/configmap",
    "kubernetes.io/secret",
    "kubernetes.io/downward-api",
    "kubernetes.io/projected",
];

/// Answers, for a reconstructed spec of a plugin, whether the plugin attaches or stages it
/// (its unique name is then node-wide); `None` when the plugin is not registered (yet).
pub type NodeWide<'a> = &'a dyn Fn(&str, &VolumeSpec) -> Option<bool>;

/// The published record a pod volume directory stands for, uncertain, or why it cannot be
/// attributed to a plugin.
pub fn attribute(
    dir: &PodVolumeDir,
    vol_data: &VolDataRead,
    node_wide: NodeWide<'_>,
) -> Result<PublishedVolume, String> {
    let plugin_dir = dir.plugin_dir.as_str();
    let (plugin, spec, unique) = if plugin_dir == escape(CSI_PLUGIN_NAME) {
        let data = match vol_data {
            None => {
                return Err(format!(
                    "{} has no vol_data.json: its csi driver is unknown",
                    dir.path.display()
                ));
            }
            Some(Err(reason)) => return Err(format!("{}: {reason}", dir.path.display())),
            Some(Ok(data)) => data,
        };
        csi_record(dir, data)?
    } else if let Some(plugin) = COMPILED_IN.iter().find(|p| escape(p) == plugin_dir) {
        let spec = compiled_in_spec(plugin, &dir.volume);
        let wide = node_wide(plugin, &spec).unwrap_or(false);
        let unique = unique_volume_name(plugin, spec.name(), wide, &dir.pod_uid);
        (plugin.to_string(), spec, unique)
    } else if let Some(driver) = flex_driver(plugin_dir) {
        let spec = inline(Volume {
            name: dir.volume.clone(),
            flex_volume: Some(FlexVolumeSource { driver: driver.clone(), ..Default::default() }),
            ..Default::default()
        });
        // Attachable Flexvolume drivers are the common case; the reconciler matches a wanted
        // volume by target, so a wrong guess costs nothing there.
        let wide = node_wide(&driver, &spec).unwrap_or(true);
        let unique = unique_volume_name(&driver, spec.name(), wide, &dir.pod_uid);
        (driver, spec, unique)
    } else {
        return Err(format!(
            "{}: no volume plugin kvol knows files volumes under {plugin_dir:?}",
            dir.path.display()
        ));
    };
    Ok(PublishedVolume {
        projection: None,
        fs_size: None,
        expansion_deferred: None,
        key: PodVolumeKey { pod_uid: dir.pod_uid.clone(), volume: dir.volume.clone() },
        pod: PodInfo { uid: dir.pod_uid.clone(), ..PodInfo::default() },
        pod_name: String::new(),
        unique_name: unique,
        plugin,
        spec,
        target: dir.path.clone(),
        staging_path: None,
        device_path: None,
        uncertain: true,
    })
}

/// A CSI pod volume directory from its `vol_data.json`: the driver is the plugin; a persistent
/// volume is node-wide by its handle, an ephemeral one per pod.
fn csi_record(dir: &PodVolumeDir, data: &VolData) -> Result<(String, VolumeSpec, String), String> {
    if data.driver_name.is_empty() {
        return Err(format!("{}: vol_data.json names no driver", dir.path.display()));
    }
    let driver = data.driver_name.clone();
    if data.volume_lifecycle_mode == "Ephemeral" {
        let spec = inline(Volume {
            name: dir.volume.clone(),
            csi: Some(CSIVolumeSource { driver: driver.clone(), ..Default::default() }),
            ..Default::default()
        });
        let unique = unique_volume_name(CSI_PLUGIN_NAME, spec.name(), false, &dir.pod_uid);
        return Ok((driver, spec, unique));
    }
    if data.volume_handle.is_empty() {
        return Err(format!("{}: vol_data.json names no volume handle", dir.path.display()));
    }
    let name = if data.spec_volume_id.is_empty() { dir.volume.clone() } else { data.spec_volume_id.clone() };
    let spec = csi_pv(&name, &driver, &data.volume_handle);
    let unique =
        unique_volume_name(CSI_PLUGIN_NAME, &format!("{driver}^{}", data.volume_handle), true, &dir.pod_uid);
    Ok((driver, spec, unique))
}

/// A staged CSI volume found at `staging_path` (`…/<driver>/<hash>/globalmount`, mounted) with
/// the `vol_data.json` of its volume directory, as an uncertain staged record.
pub fn attribute_staged(staging_path: &Path, data: &VolData) -> Result<StagedVolume, String> {
    if data.driver_name.is_empty() || data.volume_handle.is_empty() {
        return Err(format!(
            "{}: its vol_data.json names no driver or volume handle",
            staging_path.display()
        ));
    }
    let driver = &data.driver_name;
    let handle = &data.volume_handle;
    let name = if data.spec_volume_id.is_empty() { handle.clone() } else { data.spec_volume_id.clone() };
    Ok(StagedVolume {
        unique_name: unique_volume_name(CSI_PLUGIN_NAME, &format!("{driver}^{handle}"), true, ""),
        plugin: driver.clone(),
        spec: csi_pv(&name, driver, handle),
        staging_path: staging_path.to_path_buf(),
        device_path: None,
        uncertain: true,
    })
}

fn compiled_in_spec(plugin: &str, volume: &str) -> VolumeSpec {
    match plugin {
        "kubernetes.io/local-volume" => VolumeSpec::persistent(PersistentVolume {
            metadata: ObjectMeta { name: Some(volume.to_string()), ..Default::default() },
            spec: Some(PersistentVolumeSpec {
                local: Some(LocalVolumeSource::default()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        "kubernetes.io/host-path" => inline(Volume {
            name: volume.to_string(),
            host_path: Some(HostPathVolumeSource::default()),
            ..Default::default()
        }),
        "kubernetes.io/configmap" => inline(Volume {
            name: volume.to_string(),
            config_map: Some(Default::default()),
            ..Default::default()
        }),
        "kubernetes.io/secret" => inline(Volume {
            name: volume.to_string(),
            secret: Some(Default::default()),
            ..Default::default()
        }),
        "kubernetes.io/downward-api" => inline(Volume {
            name: volume.to_string(),
            downward_api: Some(Default::default()),
            ..Default::default()
        }),
        "kubernetes.io/projected" => inline(Volume {
            name: volume.to_string(),
            projected: Some(Default::default()),
            ..Default::default()
        }),
        _ => inline(Volume {
            name: volume.to_string(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        }),
    }
}

fn csi_pv(name: &str, driver: &str, handle: &str) -> VolumeSpec {
    VolumeSpec::persistent(PersistentVolume {
        metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.to_string(),
                volume_handle: handle.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// An inline spec of a pod whose namespace is not known (reconstructed from disk).
fn inline(volume: Volume) -> VolumeSpec {
    VolumeSpec::inline(volume, "")
}

fn escape(plugin: &str) -> String {
    kvol_plugin::host::escape_plugin_name(plugin)
}

/// `vendor~driver` → `vendor/driver`: a Flexvolume plugin's directory (exactly one `~`, both
/// sides non-empty, not the `kubernetes.io` vendor).
fn flex_driver(plugin_dir: &str) -> Option<String> {
    let (vendor, driver) = plugin_dir.split_once('~')?;
    let plain = |s: &str| !s.is_empty() && !s.contains('~');
    (plain(vendor) && plain(driver) && vendor != "kubernetes.io").then(|| format!("{vendor}/{driver}"))
}

/// What reconstruction found: records to adopt (uncertain), and directories it could not
/// attribute, with why.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reconstructed {
    pub published: Vec<PublishedVolume>,
    pub staged: Vec<StagedVolume>,
    pub unattributed: Vec<(PodVolumeDir, String)>,
}

/// Attributes every orphan pod volume directory, and every mounted CSI staging path no staged
/// record names, by the rules above.
pub fn reconstruct(
    orphans: &[PodVolumeDir],
    seen: &NodeObservation,
    actual: &ActualState,
    node_wide: NodeWide<'_>,
) -> Reconstructed {
    let mut found = Reconstructed::default();
    for orphan in orphans {
        let data = seen.vol_data.get(&orphan.path).cloned().flatten();
        match attribute(orphan, &data, node_wide) {
            Ok(record) => found.published.push(record),
            Err(reason) => found.unattributed.push((orphan.clone(), reason)),
        }
    }
    for (staging_path, data) in &seen.csi_staged {
        let recorded = actual.staged.values().any(|s| &s.staging_path == staging_path);
        if recorded || !seen.mount_points.contains(staging_path) {
            continue;
        }
        if let Ok(record) = attribute_staged(staging_path, data)
            && !actual.staged.contains_key(&record.unique_name)
        {
            found.staged.push(record);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(plugin_dir: &str, volume: &str) -> PodVolumeDir {
        PodVolumeDir {
            pod_uid: "u1".into(),
            plugin_dir: plugin_dir.into(),
            volume: volume.into(),
            path: PathBuf::from(format!("/k/pods/u1/volumes/{plugin_dir}/{volume}")),
        }
    }

    fn vol_data(driver: &str, handle: &str, mode: &str) -> VolDataRead {
        Some(Ok(VolData {
            driver_name: driver.into(),
            volume_handle: handle.into(),
            spec_volume_id: "pv-1".into(),
            volume_lifecycle_mode: mode.into(),
            ..VolData::default()
        }))
    }

    #[test]
    fn directories_are_attributed_to_their_plugin_or_reported() {
        let flex_attaches = |plugin: &str, _: &VolumeSpec| (plugin == "acme/san").then_some(true);
        // (plugin dir, volume, vol_data, Ok((plugin, unique name)) or Err(reason fragment))
        type Row<'a> = (&'a str, &'a str, VolDataRead, Result<(&'a str, &'a str), &'a str>);
        let rows: Vec<Row> = vec![
            (
                "kubernetes.io~csi",
                "data",
                vol_data("d.csi", "h1", "Persistent"),
                Ok(("d.csi", "kubernetes.io/csi/d.csi^h1")),
            ),
            (
                "kubernetes.io~csi",
                "scratch",
                vol_data("d.csi", "csi-abc", "Ephemeral"),
                Ok(("d.csi", "kubernetes.io/csi/u1-scratch")),
            ),
            ("kubernetes.io~csi", "data", None, Err("has no vol_data.json")),
            ("kubernetes.io~csi", "data", Some(Err("not json".into())), Err("not json")),
            ("kubernetes.io~csi", "data", vol_data("", "h1", ""), Err("names no driver")),
            ("kubernetes.io~csi", "data", vol_data("d.csi", "", "Persistent"), Err("names no volume handle")),
            (
                "kubernetes.io~empty-dir",
                "cache",
                None,
                Ok(("kubernetes.io/empty-dir", "kubernetes.io/empty-dir/u1-cache")),
            ),
            (
                "kubernetes.io~host-path",
                "logs",
                None,
                Ok(("kubernetes.io/host-path", "kubernetes.io/host-path/u1-logs")),
            ),
            (
                "kubernetes.io~local-volume",
                "pv-9",
                None,
                Ok(("kubernetes.io/local-volume", "kubernetes.io/local-volume/u1-pv-9")),
            ),
            ("acme~san", "v", None, Ok(("acme/san", "acme/san/v"))),
            ("kvol~tmpfs", "v", None, Ok(("kvol/tmpfs", "kvol/tmpfs/v"))),
            ("kubernetes.io~nfs", "v", None, Err("no volume plugin kvol knows")),
            ("a~b~c", "v", None, Err("no volume plugin kvol knows")),
            ("plain", "v", None, Err("no volume plugin kvol knows")),
        ];
        for (plugin_dir, volume, data, want) in rows {
            let got = attribute(&dir(plugin_dir, volume), &data, &flex_attaches);
            match (got, want) {
                (Ok(record), Ok((plugin, unique))) => {
                    assert_eq!(
                        (record.plugin.as_str(), record.unique_name.as_str()),
                        (plugin, unique),
                        "{plugin_dir}"
                    );
                    assert!(record.uncertain, "{plugin_dir}: reconstructed records are uncertain");
                    assert_eq!(record.target, dir(plugin_dir, volume).path);
                }
                (Err(reason), Err(fragment)) => assert!(reason.contains(fragment), "{plugin_dir}: {reason}"),
                (got, want) => panic!("{plugin_dir}/{volume}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_staged_csi_volume_is_attributed_from_its_vol_data() {
        let path = Path::new("/k/plugins/kubernetes.io/csi/d.csi/abc/globalmount");
        let Some(Ok(data)) = vol_data("d.csi", "h1", "") else { unreachable!() };
        let staged = attribute_staged(path, &data).unwrap();
        assert_eq!(staged.unique_name, "kubernetes.io/csi/d.csi^h1");
        assert_eq!((staged.plugin.as_str(), staged.uncertain), ("d.csi", true));
        assert!(attribute_staged(path, &VolData::default()).is_err());
    }
}
