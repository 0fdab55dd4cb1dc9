//! The volumes made of API objects — configMap, secret, downwardAPI and projected — as kubelet's four plugins serve them: an emptyDir (a tmpfs for all but configMap) filled by the atomic writer.
//!
//! The agent makes what a volume holds ([`kvol_api::projection`], pure) and hands it over in
//! [`PublishRequest::projection`]; the plugin mints the service-account tokens a projected
//! volume asks for (through the host's [`crate::tokens::TokenCache`]), then writes. A publish of
//! an unchanged volume writes nothing; a crash at any step of a write is put right by the next
//! publish ([`atomic_writer::repair`]). Teardown is emptyDir's: the tmpfs unmounted, the
//! directory removed, never through another mount.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::time::SystemTime;

use async_trait::async_trait;
use kvol_api::pod::TokenAudience;
use kvol_api::projection::{FileProjection, Payload, Projection, ProjectionKind};

use super::atomic_writer;
use super::empty_dir::{self, Medium};
use crate::error::{PluginError, Result};
use crate::host::PluginHost;
use crate::plugin::{PluginKind, PublishRequest, UnpublishRequest, VolumeMounter, VolumePlugin};
use crate::spec::{SourceKey, VolumeSpec};

/// One of the four plugins, by its kind.
#[derive(Debug)]
pub struct PodObjectPlugin {
    kind: ProjectionKind,
    host: PluginHost,
}

impl PodObjectPlugin {
    pub fn new(kind: ProjectionKind, host: PluginHost) -> PodObjectPlugin {
        PodObjectPlugin { kind, host }
    }

    /// All four, on one host.
    pub fn all(host: &PluginHost) -> Vec<PodObjectPlugin> {
        ProjectionKind::ALL.into_iter().map(|kind| PodObjectPlugin::new(kind, host.clone())).collect()
    }

    fn medium(&self) -> Medium {
        if self.kind.in_memory() { Medium::Memory { size_limit: None } } else { Medium::Disk }
    }

    /// The projection's files with its tokens minted into them.
    async fn payload(&self, req: &PublishRequest<'_>, projection: &Projection) -> Result<Payload> {
        let mut files = projection.files.clone();
        if projection.tokens.is_empty() {
            return Ok(files);
        }
        let Some(tokens) = &self.host.tokens else {
            return Err(PluginError::invalid(
                req.spec,
                "its serviceAccountToken needs the API server's TokenRequest, and kvol runs without one",
            ));
        };
        for wanted in &projection.tokens {
            let audience = TokenAudience {
                audience: wanted.audience.clone(),
                expiration_seconds: wanted.expiration_seconds,
            };
            let token = tokens.token(req.pod, &audience, SystemTime::now()).await.map_err(|why| {
                PluginError::invalid(req.spec, format!("serviceAccountToken {:?}: {why}", wanted.path))
            })?;
            files.insert(
                wanted.path.clone(),
                FileProjection { data: token.into_bytes(), mode: wanted.mode, fs_user: wanted.fs_user },
            );
        }
        Ok(files)
    }
}

impl VolumePlugin for PodObjectPlugin {
    fn name(&self) -> &str {
        self.kind.plugin_name()
    }

    fn kind(&self) -> PluginKind {
        PluginKind::CompiledIn
    }

    fn serves(&self) -> Vec<SourceKey<'_>> {
        vec![SourceKey::Field(self.kind.field())]
    }

    fn can_support(&self, spec: &VolumeSpec) -> bool {
        spec.inline_volume().and_then(ProjectionKind::of) == Some(self.kind)
    }

    /// The pod's name for the volume, as kubelet names these.
    fn volume_name(&self, spec: &VolumeSpec) -> Result<String> {
        if !self.can_support(spec) {
            return Err(PluginError::invalid(spec, format!("it is not a {} volume", self.kind.field())));
        }
        Ok(spec.name().to_string())
    }

    /// Published again from time to time, as kubelet remounts these on every pod sync: the
    /// tokens of a projected volume are rotated so (its other content follows changes at once).
    fn requires_remount(&self, spec: &VolumeSpec) -> bool {
        let sources =
            spec.inline_volume().and_then(|v| v.projected.as_ref()).and_then(|p| p.sources.as_deref());
        sources.unwrap_or_default().iter().any(|s| s.service_account_token.is_some())
    }

    fn mounter(&self) -> Option<&dyn VolumeMounter> {
        Some(self)
    }
}

#[async_trait]
impl VolumeMounter for PodObjectPlugin {
    /// Sets up the emptyDir, puts right what a crash left, and writes the projection (nothing
    /// when it is already there).
    async fn publish(&self, req: &PublishRequest<'_>) -> Result<()> {
        if !self.can_support(req.spec) {
            return Err(PluginError::invalid(req.spec, format!("it is not a {} volume", self.kind.field())));
        }
        let projection = req.projection.ok_or_else(|| {
            PluginError::invalid(
                req.spec,
                "no content was made for it (the agent hands it over with the publish)",
            )
        })?;
        let payload = self.payload(req, projection).await?;
        empty_dir::set_up(&self.host, req, self.medium())?;
        let root = self.host.paths.open_root()?;
        let repaired =
            atomic_writer::repair(&root, req.target).map_err(|e| PluginError::io("repair", req.target, e))?;
        if !repaired.is_empty() {
            tracing::info!(volume = %req.target.display(), done = %repaired.join(", "), "put right what an interrupted write left");
        }
        let fs_group = match req.pod.fs_group.map(u32::try_from) {
            None => None,
            Some(Ok(gid)) => Some(gid),
            Some(Err(_)) => {
                return Err(PluginError::invalid(req.spec, "the pod's fsGroup is not a group ID"));
            }
        };
        let random = RandomState::new().hash_one(req.target) as u32;
        let wrote = atomic_writer::write_owned(&root, req.target, &payload, random, fs_group)
            .map_err(|e| PluginError::io("write the payload into", req.target, e))?;
        if wrote {
            tracing::debug!(volume = %req.target.display(), files = payload.len(), "payload written");
        }
        Ok(())
    }

    async fn unpublish(&self, req: &UnpublishRequest<'_>) -> Result<()> {
        empty_dir::tear_down(&self.host, req.target)?;
        if let Some(tokens) = &self.host.tokens
            && self.kind == ProjectionKind::Projected
        {
            tokens.forget_pod(req.pod_uid);
        }
        Ok(())
    }
}
