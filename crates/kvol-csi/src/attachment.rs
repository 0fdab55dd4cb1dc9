//! Attach in cluster mode: the node waits for the VolumeAttachment the attach/detach controller makes, read through the [`AttachmentSource`] seam, instead of calling ControllerPublishVolume itself.
//!
//! Upstream names the object `csi-` + hex SHA-256 of volume handle, driver and node name
//! ([`crate::paths::attachment_id`]); the external-attacher sets `status.attached` and
//! `status.attachmentMetadata` (the publish context) or `status.attachError`. What the node
//! makes of one object is [`attachment_state`], pure and table-tested here.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::storage::v1::VolumeAttachment;

/// Reads VolumeAttachments by name: the API server in cluster mode, memory in tests.
#[async_trait]
pub trait AttachmentSource: Send + Sync + std::fmt::Debug {
    /// The VolumeAttachment called `name`, `None` when there is none; `Err` names why it
    /// could not be read (the API is away, access is denied).
    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>, String>;

    /// Whether the attach/detach controller manages `node` (its Node carries
    /// `volumes.kubernetes.io/controller-managed-attach-detach: "true"`); `None` when the
    /// source cannot tell. Asked only while a VolumeAttachment is missing.
    async fn node_managed_by_controller(&self, _node: &str) -> Result<Option<bool>, String> {
        Ok(None)
    }
}

/// How long a missing VolumeAttachment is waited for before the node's annotation is
/// checked: the agent's own write of it may still be on its way.
pub const UNMANAGED_NODE_GRACE: Duration = Duration::from_secs(5);

/// What one VolumeAttachment says about a volume on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttachmentState {
    /// Attached: the publish context to stage and publish with.
    Attached(BTreeMap<String, String>),
    /// Not yet: why, for the log and the pod's status line.
    Pending(String),
    /// The controller reported an error, or the object is not for this volume and node.
    Failed(String),
}

/// What `attachment` (named `name`) says about `handle` of `driver` on `node`.
pub fn attachment_state(
    name: &str,
    attachment: Option<&VolumeAttachment>,
    driver: &str,
    handle: &str,
    node: &str,
) -> AttachmentState {
    let Some(va) = attachment else {
        return AttachmentState::Pending(format!(
            "waiting for the attach/detach controller to create volumeattachment {name}"
        ));
    };
    if va.spec.attacher != driver || va.spec.node_name != node {
        return AttachmentState::Failed(format!(
            "volumeattachment {name} is for driver {:?} on node {:?}, not {driver:?} on {node:?}",
            va.spec.attacher, va.spec.node_name
        ));
    }
    let status = va.status.as_ref();
    if let Some(error) = status.and_then(|s| s.attach_error.as_ref()) {
        let message = error.message.as_deref().filter(|m| !m.is_empty()).unwrap_or("no message given");
        return AttachmentState::Failed(format!(
            "attach of volume {handle:?} failed (volumeattachment {name}): {message}"
        ));
    }
    match status {
        Some(s) if s.attached => {
            AttachmentState::Attached(s.attachment_metadata.clone().unwrap_or_default().into_iter().collect())
        }
        _ => AttachmentState::Pending(format!("waiting for volumeattachment {name} to be attached")),
    }
}

/// Polls `source` for `name` until it is attached or failed, or `timeout` passed; the delay
/// between reads doubles from 100 ms to 2 s. A read error is only logged: the API may come back.
pub async fn wait_for_attachment(
    source: &dyn AttachmentSource,
    name: &str,
    driver: &str,
    handle: &str,
    node: &str,
    timeout: Duration,
) -> Result<BTreeMap<String, String>, String> {
    let started = tokio::time::Instant::now();
    let deadline = started + timeout;
    let mut delay = Duration::from_millis(100);
    let mut last;
    loop {
        last = match source.volume_attachment(name).await {
            Ok(None) if started.elapsed() >= UNMANAGED_NODE_GRACE => {
                if let Ok(Some(false)) = source.node_managed_by_controller(node).await {
                    return Err(unmanaged_node(node, name));
                }
                attachment_state_pending(name)
            }
            Ok(va) => match attachment_state(name, va.as_ref(), driver, handle, node) {
                AttachmentState::Attached(context) => return Ok(context),
                AttachmentState::Failed(reason) => return Err(reason),
                AttachmentState::Pending(reason) => reason,
            },
            Err(reason) => format!("cannot read volumeattachment {name}: {reason}"),
        };
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(format!("timed out after {timeout:?}: {last}"));
        }
        tokio::time::sleep(delay.min(deadline - now)).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// Why a missing VolumeAttachment is waited for.
fn attachment_state_pending(name: &str) -> String {
    match attachment_state(name, None, "", "", "") {
        AttachmentState::Pending(reason) => reason,
        other => format!("{other:?}"),
    }
}

/// Why the controller will not create `name`: it does not manage `node`.
pub fn unmanaged_node(node: &str, name: &str) -> String {
    format!(
        "the attach/detach controller does not manage node {node} (its annotation {} is not \"true\"), so it will not create volumeattachment {name}",
        kvol_api::keys::ANN_CONTROLLER_MANAGED_ATTACH_DETACH
    )
}

/// VolumeAttachments in memory, for tests: put, remove, and count reads.
#[derive(Debug, Default, Clone)]
pub struct MemoryAttachments {
    inner: Arc<Mutex<(HashMap<String, VolumeAttachment>, usize)>>,
    /// What [`AttachmentSource::node_managed_by_controller`] answers.
    managed: Arc<Mutex<Option<bool>>>,
}

impl MemoryAttachments {
    pub fn put(&self, va: VolumeAttachment) {
        let name = va.metadata.name.clone().unwrap_or_default();
        self.lock().0.insert(name, va);
    }

    pub fn remove(&self, name: &str) {
        self.lock().0.remove(name);
    }

    /// Sets whether the node counts as managed by the attach/detach controller.
    pub fn set_managed(&self, managed: Option<bool>) {
        *self.managed.lock().unwrap_or_else(|p| p.into_inner()) = managed;
    }

    /// How many reads were made.
    pub fn reads(&self) -> usize {
        self.lock().1
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (HashMap<String, VolumeAttachment>, usize)> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl AttachmentSource for MemoryAttachments {
    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>, String> {
        let mut inner = self.lock();
        inner.1 += 1;
        Ok(inner.0.get(name).cloned())
    }

    async fn node_managed_by_controller(&self, _node: &str) -> Result<Option<bool>, String> {
        Ok(*self.managed.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn va(driver: &str, node: &str, status: serde_json::Value) -> VolumeAttachment {
        serde_json::from_value(json!({
            "metadata": {"name": "csi-x"},
            "spec": {"attacher": driver, "nodeName": node, "source": {"persistentVolumeName": "pv1"}},
            "status": status,
        }))
        .expect("a volumeattachment")
    }

    fn attached(pairs: &[(&str, &str)]) -> AttachmentState {
        AttachmentState::Attached(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    #[test]
    fn attachment_states() {
        let cases: Vec<(&str, Option<VolumeAttachment>, AttachmentState)> = vec![
            (
                "none yet",
                None,
                AttachmentState::Pending(
                    "waiting for the attach/detach controller to create volumeattachment csi-x".into(),
                ),
            ),
            (
                "created, no status",
                Some(va("d.csi", "n1", json!(null))),
                AttachmentState::Pending("waiting for volumeattachment csi-x to be attached".into()),
            ),
            (
                "attached false",
                Some(va("d.csi", "n1", json!({"attached": false}))),
                AttachmentState::Pending("waiting for volumeattachment csi-x to be attached".into()),
            ),
            ("attached, no metadata", Some(va("d.csi", "n1", json!({"attached": true}))), attached(&[])),
            (
                "attached with metadata",
                Some(va("d.csi", "n1", json!({"attached": true, "attachmentMetadata": {"lun": "3"}}))),
                attached(&[("lun", "3")]),
            ),
            (
                "attach error wins over attached",
                Some(va(
                    "d.csi",
                    "n1",
                    json!({"attached": true, "attachError": {"message": "disk is in use by vm-7"}}),
                )),
                AttachmentState::Failed(
                    "attach of volume \"h1\" failed (volumeattachment csi-x): disk is in use by vm-7".into(),
                ),
            ),
            (
                "attach error without a message",
                Some(va("d.csi", "n1", json!({"attached": false, "attachError": {}}))),
                AttachmentState::Failed(
                    "attach of volume \"h1\" failed (volumeattachment csi-x): no message given".into(),
                ),
            ),
            (
                "another node",
                Some(va("d.csi", "n2", json!({"attached": true}))),
                AttachmentState::Failed(
                    "volumeattachment csi-x is for driver \"d.csi\" on node \"n2\", not \"d.csi\" on \"n1\""
                        .into(),
                ),
            ),
            (
                "another driver",
                Some(va("e.csi", "n1", json!({"attached": true}))),
                AttachmentState::Failed(
                    "volumeattachment csi-x is for driver \"e.csi\" on node \"n1\", not \"d.csi\" on \"n1\""
                        .into(),
                ),
            ),
        ];
        for (name, va, want) in cases {
            assert_eq!(attachment_state("csi-x", va.as_ref(), "d.csi", "h1", "n1"), want, "{name}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_ends_when_the_controller_marks_the_attachment() {
        let source = MemoryAttachments::default();
        let writer = source.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            writer.put(va("d.csi", "n1", json!({"attached": false})));
            tokio::time::sleep(Duration::from_secs(3)).await;
            writer.put(va("d.csi", "n1", json!({"attached": true, "attachmentMetadata": {"lun": "1"}})));
        });
        let start = tokio::time::Instant::now();
        let context = wait_for_attachment(&source, "csi-x", "d.csi", "h1", "n1", Duration::from_secs(60))
            .await
            .expect("attached");
        assert_eq!(context.get("lun").map(String::as_str), Some("1"));
        let waited = start.elapsed();
        assert!(waited >= Duration::from_secs(4) && waited < Duration::from_secs(7), "{waited:?}");
        assert!(source.reads() < 15, "backoff keeps reads few: {}", source.reads());
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_fails_at_once_on_an_attach_error_and_at_the_timeout_when_nothing_comes() {
        let source = MemoryAttachments::default();
        let err = wait_for_attachment(&source, "csi-x", "d.csi", "h1", "n1", Duration::from_secs(5))
            .await
            .expect_err("nothing came");
        assert_eq!(
            err,
            "timed out after 5s: waiting for the attach/detach controller to create volumeattachment csi-x"
        );
        source.put(va("d.csi", "n1", json!({"attachError": {"message": "quota exceeded"}})));
        let reads = source.reads();
        let err = wait_for_attachment(&source, "csi-x", "d.csi", "h1", "n1", Duration::from_secs(5))
            .await
            .expect_err("failed");
        assert!(err.ends_with("quota exceeded"), "{err}");
        assert_eq!(source.reads(), reads + 1, "an attach error needs one read");
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_the_controller_does_not_manage_is_said_after_the_grace_not_waited_out() {
        let source = MemoryAttachments::default();
        source.set_managed(Some(false));
        let start = tokio::time::Instant::now();
        let err = wait_for_attachment(&source, "csi-x", "d.csi", "h1", "n1", Duration::from_secs(120))
            .await
            .expect_err("the controller will not attach");
        assert_eq!(err, unmanaged_node("n1", "csi-x"));
        assert!(err.contains("volumes.kubernetes.io/controller-managed-attach-detach"), "{err}");
        let waited = start.elapsed();
        assert!(waited >= UNMANAGED_NODE_GRACE && waited < UNMANAGED_NODE_GRACE * 2, "{waited:?}");
        // Managed (or unknown): waited for, as before.
        for managed in [Some(true), None] {
            source.set_managed(managed);
            let err = wait_for_attachment(&source, "csi-x", "d.csi", "h1", "n1", Duration::from_secs(10))
                .await
                .expect_err("nothing came");
            assert!(err.starts_with("timed out after 10s"), "{managed:?}: {err}");
        }
    }
}
