//! The LVM driver's core: its configuration, the running lvmd.yaml, lvm and the mount seam behind one lock shared by the controller and node services; lookups of the driver's logical volumes and of a class's space.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvol_plugin::mount::Mounter;
use tonic::Status;

use crate::LvmDriverConfig;
use crate::capacity::Space;
use crate::command::CommandError;
use crate::lvm::Lvm;
use crate::lvmd::{ClassKind, DeviceClass, LvmdConfig};
use crate::lvs::LogicalVolume;
use crate::reload::{self, Owned};
use kvol_csi::proto::csi;

/// The StorageClass parameter naming a device class, as TopoLVM spells it.
pub const DEVICE_CLASS_PARAMETER: &str = "topolvm.io/device-class";

/// The core every RPC locks for its whole run, lvm calls and mounts included, so operations on
/// the node never interleave (the lock is tokio's: a waiting RPC yields).
pub(crate) type Shared = Arc<tokio::sync::Mutex<Core>>;

/// Configuration, the running lvmd.yaml, lvm and the mount seam.
#[derive(Debug)]
pub(crate) struct Core {
    pub config: Arc<LvmDriverConfig>,
    pub lvmd: LvmdConfig,
    pub lvm: Lvm,
    pub mounter: Arc<dyn Mounter>,
}

/// An INTERNAL status carrying an lvm (or other command) error.
pub(crate) fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

/// An lvm error about volume `id`.
pub(crate) fn lvm_error(id: &str, e: CommandError) -> Status {
    Status::internal(format!("volume {id}: {e}"))
}

/// Checks that a required string field is set.
pub(crate) fn required<'a>(value: &'a str, what: &str) -> Result<&'a str, Status> {
    if value.is_empty() { Err(Status::invalid_argument(format!("{what} is missing"))) } else { Ok(value) }
}

/// Checks that a required path field is set and absolute; normalised.
pub(crate) fn required_path(id: &str, value: &str, what: &str) -> Result<PathBuf, Status> {
    let path = Path::new(
        required(value, what)
            .map_err(|s| Status::invalid_argument(format!("volume {id}: {}", s.message())))?,
    );
    if !path.is_absolute() {
        return Err(Status::invalid_argument(format!("volume {id}: {what} {value} is not an absolute path")));
    }
    Ok(path.components().collect())
}

/// The device class StorageClass `parameters` choose in `lvmd`: the one named by
/// [`DEVICE_CLASS_PARAMETER`] (or `<driver>/device-class`), else the default.
pub fn choose_class<'a>(
    lvmd: &'a LvmdConfig,
    driver: &str,
    parameters: &HashMap<String, String>,
) -> Result<&'a DeviceClass, String> {
    let own = format!("{driver}/device-class");
    let named =
        parameters.get(DEVICE_CLASS_PARAMETER).or_else(|| parameters.get(&own)).filter(|n| !n.is_empty());
    match named {
        Some(name) => lvmd.class(name).ok_or_else(|| {
            let known: Vec<&str> = lvmd.device_classes.iter().map(|c| c.name.as_str()).collect();
            format!("device class {name:?} is not in lvmd.yaml (it has: {})", known.join(", "))
        }),
        None => lvmd.default_class().ok_or_else(|| {
            format!("no device class is named (parameter {DEVICE_CLASS_PARAMETER}) and lvmd.yaml has no default class")
        }),
    }
}

/// Counts logical volumes per target (`vg` or `vg/pool`).
pub fn count_owned(lvs: &[LogicalVolume]) -> Owned {
    let mut owned = Owned::new();
    for lv in lvs {
        *owned.entry(reload::target_of(&lv.vg, lv.pool.as_deref())).or_default() += 1;
    }
    owned
}

impl Core {
    /// The driver's logical volumes, from lvm (the only record).
    pub async fn owned(&self) -> Result<Vec<LogicalVolume>, Status> {
        self.lvm.owned(&self.config.driver_name).await.map_err(internal)
    }

    /// The driver's logical volume whose name is `id`.
    pub async fn find(&self, id: &str) -> Result<Option<LogicalVolume>, Status> {
        Ok(self.owned().await?.into_iter().find(|lv| lv.name == id))
    }

    /// The driver's logical volume `id`, or NOT_FOUND.
    pub async fn get(&self, id: &str) -> Result<LogicalVolume, Status> {
        self.find(id).await?.ok_or_else(|| Status::not_found(format!("volume {id} does not exist")))
    }

    /// The space class `class` draws on now.
    pub async fn space(&self, class: &DeviceClass) -> Result<Space, Status> {
        let vg = &class.volume_group;
        match (class.class_kind(), &class.thin_pool) {
            (Some(ClassKind::Thin), Some(pool)) => {
                let lvs = self.lvm.in_group(vg).await.map_err(internal)?;
                let pool_lv =
                    lvs.iter().find(|lv| lv.name == pool.name && lv.is_thin_pool()).ok_or_else(|| {
                        Status::failed_precondition(format!(
                            "device class {}: thin pool {vg}/{} does not exist",
                            class.name, pool.name
                        ))
                    })?;
                let virtual_used = lvs
                    .iter()
                    .filter(|lv| lv.pool.as_deref() == Some(pool.name.as_str()))
                    .map(|lv| lv.size)
                    .sum();
                Ok(Space::Thin { pool_size: pool_lv.size, virtual_used })
            }
            _ => {
                let group =
                    self.lvm.group(vg).await.map_err(|e| {
                        Status::failed_precondition(format!("device class {}: {e}", class.name))
                    })?;
                Ok(Space::Thick { vg_free: group.free })
            }
        }
    }

    /// The extent size of volume group `vg`.
    pub async fn extent(&self, vg: &str) -> Result<u64, Status> {
        Ok(self.lvm.group(vg).await.map_err(internal)?.extent_size)
    }

    /// The class a logical volume was made in: by its target (its pool or VG).
    pub fn class_of(&self, lv: &LogicalVolume) -> Option<&DeviceClass> {
        let target = reload::target_of(&lv.vg, lv.pool.as_deref());
        self.lvmd.device_classes.iter().find(|c| c.target() == target)
    }

    /// This node's topology: `{topology.<driver>/node: <node>}`.
    pub fn topology(&self) -> csi::Topology {
        csi::Topology {
            segments: HashMap::from([(self.config.topology_key(), self.config.node_name.clone())]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lvmd::DeviceClass;

    #[test]
    fn classes_are_chosen_by_parameter_or_default() {
        let class = |name: &str, default: bool| DeviceClass {
            name: name.into(),
            volume_group: "vg".into(),
            default,
            ..Default::default()
        };
        let lvmd = LvmdConfig {
            device_classes: vec![class("hdd", true), class("ssd", false)],
            ..Default::default()
        };
        let no_default = LvmdConfig { device_classes: vec![class("ssd", false)], ..Default::default() };
        let p = |pairs: &[(&str, &str)]| {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>()
        };
        type Row<'a> = (&'a LvmdConfig, HashMap<String, String>, Result<&'a str, &'a str>);
        let rows: Vec<Row> = vec![
            (&lvmd, p(&[]), Ok("hdd")),
            (&lvmd, p(&[("topolvm.io/device-class", "ssd")]), Ok("ssd")),
            (&lvmd, p(&[("lvm.csi.kvol.io/device-class", "ssd")]), Ok("ssd")),
            (&lvmd, p(&[("topolvm.io/device-class", "")]), Ok("hdd")),
            (&lvmd, p(&[("csi.storage.k8s.io/pvc/name", "x")]), Ok("hdd")),
            (
                &lvmd,
                p(&[("topolvm.io/device-class", "nvme")]),
                Err("device class \"nvme\" is not in lvmd.yaml (it has: hdd, ssd)"),
            ),
            (
                &no_default,
                p(&[]),
                Err(
                    "no device class is named (parameter topolvm.io/device-class) and lvmd.yaml has no default class",
                ),
            ),
        ];
        for (config, params, want) in rows {
            let got = choose_class(config, "lvm.csi.kvol.io", &params).map(|c| c.name.as_str());
            assert_eq!(got, want.map_err(str::to_string), "{params:?}");
        }
    }

    #[test]
    fn owned_volumes_count_per_target() {
        let lv = |vg: &str, pool: Option<&str>| LogicalVolume {
            vg: vg.into(),
            pool: pool.map(str::to_string),
            ..Default::default()
        };
        let owned = count_owned(&[
            lv("vg0", None),
            lv("vg0", Some("pool")),
            lv("vg0", Some("pool")),
            lv("vg1", None),
        ]);
        let want: Owned =
            [("vg0".to_string(), 1), ("vg0/pool".to_string(), 2), ("vg1".to_string(), 1)].into();
        assert_eq!(owned, want);
    }
}
