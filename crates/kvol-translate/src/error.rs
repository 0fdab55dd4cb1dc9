//! The one error type of translation.

use kvol_api::MigratablePlugin;

/// Why a spec could not be translated. Messages are lower-case and name the object.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TranslateError {
    #[error("persistent volume {name:?} has no in-tree source that can be translated to CSI")]
    NoPluginForPv { name: String },
    #[error("inline volume {name:?} has no in-tree source that can be translated to CSI")]
    NoPluginForInline { name: String },
    #[error("{what} {name:?} has more than one volume source ({}); exactly one is allowed", sources.join(", "))]
    MultipleSources { what: &'static str, name: String, sources: Vec<&'static str> },
    #[error("no in-tree plugin named {0:?} has a storage class translation")]
    UnknownInTreePlugin(String),
    #[error("no in-tree plugin translation for CSI driver {0:?}")]
    UnknownCsiDriver(String),
    #[error("persistent volume {name:?} has no CSI source")]
    NotCsi { name: String },
    #[error(
        "{plugin} translation is not compiled into this build (cargo feature {feature:?} of kvol-translate)"
    )]
    NotCompiledIn { plugin: MigratablePlugin, feature: &'static str },
    /// A plugin-specific rule refused the object; `reason` says which.
    #[error("{plugin}: {reason}")]
    Plugin { plugin: MigratablePlugin, reason: String },
}

impl TranslateError {
    pub(crate) fn plugin(plugin: MigratablePlugin, reason: impl Into<String>) -> TranslateError {
        TranslateError::Plugin { plugin, reason: reason.into() }
    }
}
