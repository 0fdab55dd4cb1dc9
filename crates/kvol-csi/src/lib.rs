//! CSI for kvol: drivers that register over the kubelet plugin-registration protocol and are driven over gRPC.

pub mod attachment;
pub mod client;
pub mod error;
pub mod handler;
pub mod objects;
pub mod paths;
pub mod plugin;
pub mod policy;
pub mod proto;
pub mod registration;
pub mod tokens;

pub use kvol_csi_rules::{csinode, versions};

pub use attachment::{AttachmentSource, MemoryAttachments};
pub use client::{ControllerCapabilities, CsiClient, NodeCapabilities, PluginCapabilities, Timeouts};
pub use error::CsiError;
pub use handler::{CsiRegistrationHandler, RegisteredDriver};
pub use objects::{MemoryObjects, NodeObjects};
pub use plugin::{CsiPlugin, DriverCapabilities};
pub use policy::{DriverPolicy, FsGroupPolicy, LifecycleMode};
pub use registration::{RegisteredPlugin, RegistrationHandler, RegistrationWatcher, WatcherConfig};
pub use tokens::{TokenAudience, TokenSource};
pub use versions::Version;
