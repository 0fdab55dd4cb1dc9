//! PLACEHOLDER: gce_pd translation, being written; every operation refuses until then.

use k8s_openapi::api::core::v1::{PersistentVolume, Volume};
use k8s_openapi::api::storage::v1::StorageClass;
use kvol_api::MigratablePlugin;

use super::Translator;
use crate::{Result, TranslateError};

pub(crate) struct GcePd;

const PLUGIN: MigratablePlugin = MigratablePlugin::GcePd;

impl Translator for GcePd {
    fn storage_class_to_csi(&self, _sc: StorageClass) -> Result<StorageClass> {
        Err(TranslateError::plugin(PLUGIN, "not written yet"))
    }
    fn inline_to_csi(&self, _vol: &Volume, _pod_namespace: &str) -> Result<PersistentVolume> {
        Err(TranslateError::plugin(PLUGIN, "not written yet"))
    }
    fn pv_to_csi(&self, _pv: PersistentVolume) -> Result<PersistentVolume> {
        Err(TranslateError::plugin(PLUGIN, "not written yet"))
    }
    fn csi_pv_to_in_tree(&self, _pv: PersistentVolume) -> Result<PersistentVolume> {
        Err(TranslateError::plugin(PLUGIN, "not written yet"))
    }
}
