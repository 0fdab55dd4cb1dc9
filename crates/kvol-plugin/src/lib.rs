//! kvol's plugin host: lifecycle traits, the plugin registry, migration decisions and the compiled-in plugins.

pub mod atomic_file;
pub mod beneath;
pub mod block;
pub mod blocking;
pub mod catalog;
pub mod error;
pub mod fs_resize;
pub mod host;
pub mod intree;
pub mod local;
pub mod migration;
pub mod mount;
pub mod plugin;
pub mod registry;
pub mod spec;
pub mod stats;
pub mod subpath;
pub mod testing;
pub mod tokens;
pub mod watched_dir;

pub use error::{PluginError, Result};
pub use host::{NodeInfo, NodePaths, PluginHost, SecretMap, SecretStore};
pub use mount::{MountError, MountPoint, Mounter, RecordingMounter, SystemMounter};
pub use plugin::{AccessMode, Capabilities, PluginKind, PluginRef, VolumePlugin};
pub use registry::{DynamicSource, PluginRegistry, ProbeEvent, Snapshot};
pub use spec::{Migrated, SourceKey, SpecSource, VolumeSpec};
