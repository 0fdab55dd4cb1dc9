//! The one error type of the plugin host: lookups, migration decisions, mounts and local plugins.

use std::path::PathBuf;

use kvol_api::MigratablePlugin;
use kvol_translate::TranslateError;

/// Why a lookup, a decision or an operation failed. Messages are lower-case and name the spec,
/// plugin, driver or path.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("{spec} sets no volume source")]
    NoSource { spec: String },
    #[error("{spec} has more than one volume source ({}); exactly one is allowed", sources.join(", "))]
    MultipleSources { spec: String, sources: Vec<&'static str> },
    #[error("no volume plugin matched {spec} ({source_key})")]
    NoPluginMatched { spec: String, source_key: String },
    #[error("multiple volume plugins matched {spec}: {}", names.join(", "))]
    MultiplePluginsMatched { spec: String, names: Vec<String> },
    #[error("no volume plugin matched name {name:?}")]
    NoPluginNamed { name: String },
    #[error("volume plugin {name:?} is already registered{}", by.as_ref().map(|b| format!(" by {b}")).unwrap_or_default())]
    DuplicateName { name: String, by: Option<String> },
    #[error("volume plugin {plugin} cannot {what}")]
    Unsupported { plugin: String, what: &'static str },

    /// An operation asked of a migratable in-tree plugin: kvol carries its name, not its code.
    #[error(
        "in-tree plugin {} has no code in kvol: its volumes run through CSI driver {} when feature gate {} is on",
        plugin.in_tree_name(), plugin.csi_driver(), kvol_api::Gate::Migration(*plugin).name()
    )]
    NoInTreeCode { plugin: MigratablePlugin },
    /// A spec of a migratable in-tree plugin whose migration is off: kvol has no in-tree code.
    #[error(
        "{spec} uses in-tree plugin {}, which kvol serves only through CSI driver {}: turn on feature gate {gate}",
        plugin.in_tree_name(), plugin.csi_driver()
    )]
    MigrationOff { spec: String, plugin: MigratablePlugin, gate: String },
    /// The node is not migrated for the plugin, and kvol has no in-tree code to fall back to.
    #[error(
        "{spec} uses in-tree plugin {} but node {node:?} has not migrated it (its CSINode annotation {} does not list it), and kvol has no in-tree code for it",
        plugin.in_tree_name(), kvol_api::keys::ANN_MIGRATED_PLUGINS
    )]
    NodeNotMigrated { spec: String, plugin: MigratablePlugin, node: String },
    #[error(
        "in-tree plugin {} is migrated on node {node:?} but its CSI driver {} is not installed there",
        plugin.in_tree_name(), plugin.csi_driver()
    )]
    DriverNotInstalled { plugin: MigratablePlugin, node: String },
    /// A migrated spec whose CSI driver is not registered with this node's plugin host.
    #[error(
        "{spec} uses in-tree plugin {}, migrated to CSI driver {}, which is not registered on this node",
        plugin.in_tree_name(), plugin.csi_driver()
    )]
    DriverNotRegistered { spec: String, plugin: MigratablePlugin },
    #[error("cannot decide migration of {} on node {node:?}: the node has no CSINode object yet", plugin.in_tree_name())]
    NoCsiNode { plugin: MigratablePlugin, node: String },
    #[error("cannot translate {spec}: {source}")]
    Translate {
        spec: String,
        #[source]
        source: TranslateError,
    },

    /// The plugin cannot do this while the volume is in use (a CSI driver's FailedPrecondition
    /// to NodeExpandVolume): as kubelet, the node does not ask again until the volume is
    /// published again.
    #[error("volume plugin {plugin}: {reason}")]
    NotWhileInUse { plugin: String, reason: String },

    /// An out-of-process driver (Flexvolume exec, CSI gRPC) failed; `source` says how.
    /// `outcome_unknown`: the call was cut short (a deadline, a broken connection, a driver
    /// killed mid-way), so the driver may have done the work, may still be doing it, or not.
    #[error("volume plugin {plugin}: {source}")]
    Driver {
        plugin: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
        outcome_unknown: bool,
    },
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Upstream's wording (`pkg/volume/hostpath/host_path.go`): `expected` is a description
    /// (`directory`, `socket file` …), `found` a file type (`Directory`, `Socket` …).
    #[error("hostPath type check failed: {} is not a {expected}, it's a {found}", path.display())]
    HostPathType { path: PathBuf, expected: &'static str, found: &'static str },
    #[error("hostPath {} doesn't exist (hostPath type {kind})", path.display())]
    HostPathMissing { path: PathBuf, kind: &'static str },
    /// Teardown found mounts it did not make at or below a directory it was about to delete with
    /// its contents.
    #[error(
        "refusing to delete {}: other mounts lie at or below it ({}); unmount them first",
        path.display(), mounts.iter().map(|m| m.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    ForeignMounts { path: PathBuf, mounts: Vec<PathBuf> },
    /// A block device would not mount; kvol mounts existing filesystems and never formats.
    #[error(
        "cannot mount block device {} as {fstype} at {}: {source} (kvol does not format devices: it must already hold a {fstype} filesystem)",
        device.display(), path.display()
    )]
    DeviceMount {
        device: PathBuf,
        fstype: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("refusing {what} {value:?}: {reason}")]
    PathSegment { what: &'static str, value: String, reason: String },
    #[error("{spec}: {reason}")]
    InvalidSpec { spec: String, reason: String },
    #[error("{spec} cannot be used on node {node:?}: {reason}")]
    NodeAffinity { spec: String, node: String, reason: String },
}

impl PluginError {
    /// An I/O error on a path.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> PluginError {
        PluginError::Io { op, path: path.into(), source }
    }

    /// Whether the operation that failed may still have taken effect (upstream's "uncertain"
    /// progress): only a driver call cut short can say so.
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, PluginError::Driver { outcome_unknown: true, .. })
    }

    /// A spec that is well-formed YAML but wrong for its plugin.
    pub fn invalid(spec: &impl std::fmt::Display, reason: impl Into<String>) -> PluginError {
        PluginError::InvalidSpec { spec: spec.to_string(), reason: reason.into() }
    }
}

/// The result of plugin-host operations.
pub type Result<T, E = PluginError> = std::result::Result<T, E>;
