//! The kvol configuration file's shape (`--config`): strict, so a typo is an error, not a default.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::gates::{FeatureGates, GateError};

/// The configuration file. Unknown fields are rejected.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KvolConfig {
    /// Feature gates by name, as in `--feature-gates`; the command line overrides them.
    #[serde(default)]
    pub feature_gates: BTreeMap<String, bool>,
    /// Which storage components run (the CSI driver and the optional ones), as written; what
    /// the names mean is decided by `kvol-components`, which knows the component definitions.
    #[serde(default)]
    pub storage: StorageSection,
}

/// The `storage` section as written: names are kept verbatim (an unknown name is a problem
/// the component selection reports, together with every other, rather than a parse error).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StorageSection {
    /// `none`, a driver component's name, or unset/empty for the node's default driver.
    #[serde(default)]
    pub driver: Option<String>,
    /// Optional components by name; `[none]` turns them all off. Unset, `null`, `[]` and `[""]`
    /// all mean the default set (a `null` item reads as `""`).
    #[serde(default)]
    pub optional_csi_components: Option<Vec<Option<String>>>,
}

impl KvolConfig {
    /// The validated gates from this config, with `flag` (a `--feature-gates` value) applied last.
    pub fn feature_gates(&self, flag: Option<&str>) -> Result<FeatureGates, GateError> {
        let mut builder = FeatureGates::builder();
        for (name, enabled) in &self.feature_gates {
            builder.set(name, *enabled);
        }
        if let Some(flag) = flag {
            builder.parse_flag(flag)?;
        }
        builder.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MigratablePlugin;

    #[test]
    fn config_gates_then_flag() {
        let cfg: KvolConfig = serde_saphyr::from_str(
            "featureGates:\n  CSIMigrationRBD: true\n  InTreePluginRBDUnregister: true\n",
        )
        .unwrap();
        let gates = cfg.feature_gates(None).unwrap();
        assert!(gates.is_in_tree_off(MigratablePlugin::Rbd));
        // The flag turns migration off again, which makes the config's unregister invalid.
        let err = cfg.feature_gates(Some("CSIMigrationRBD=false")).unwrap_err().to_string();
        assert!(
            err.contains("InTreePluginRBDUnregister=true turns off the in-tree code of kubernetes.io/rbd"),
            "{err}"
        );
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err =
            serde_saphyr::from_str::<KvolConfig>("featureGate:\n  CSIMigrationRBD: true\n").unwrap_err();
        assert!(err.to_string().contains("featureGate"), "{err}");
        assert_eq!(serde_saphyr::from_str::<KvolConfig>("{}\n").unwrap(), KvolConfig::default());
    }

    #[test]
    fn storage_section_keeps_names_verbatim() {
        let cfg: KvolConfig = serde_saphyr::from_str(
            "storage:\n  driver: lvm\n  optionalCsiComponents: [\"\", snapshot-controller, ~]\n",
        )
        .unwrap();
        assert_eq!(cfg.storage.driver.as_deref(), Some("lvm"));
        assert_eq!(
            cfg.storage.optional_csi_components,
            Some(vec![Some(String::new()), Some("snapshot-controller".into()), None])
        );
        let err = serde_saphyr::from_str::<KvolConfig>("storage:\n  drivers: lvm\n").unwrap_err();
        assert!(err.to_string().contains("drivers"), "{err}");
    }
}
