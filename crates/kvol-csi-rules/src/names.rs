//! Upstream's hashed object names: VolumeAttachments and ephemeral inline volume handles.

use sha2::{Digest, Sha256};

/// The lower-case hex SHA-256 of `text`.
pub fn sha256_hex(text: &str) -> String {
    format!("{:x}", Sha256::digest(text.as_bytes()))
}

/// The name of a VolumeAttachment as upstream computes it: `csi-` and the hex SHA-256 of volume
/// handle, driver and node name run together.
pub fn attachment_id(volume_handle: &str, driver: &str, node: &str) -> String {
    format!("csi-{}", sha256_hex(&format!("{volume_handle}{driver}{node}")))
}

/// The volume handle of an ephemeral inline volume: `csi-` and the hex SHA-256 of the pod UID
/// followed by the pod's name for the volume (upstream's `makeVolumeHandle`).
pub fn ephemeral_volume_handle(pod_uid: &str, volume_name: &str) -> String {
    format!("csi-{}", sha256_hex(&format!("{pod_uid}{volume_name}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_hash_their_parts_as_upstream() {
        let rows = [
            // printf 'handle-1example.csi.k8s.ionode-a' | sha256sum
            (
                attachment_id("handle-1", "example.csi.k8s.io", "node-a"),
                "csi-3daf47ffb7c5109f648ceba4a2f2b911b3bdabdf68496e0b8ca328628c099ec6",
            ),
            // printf 'uid-1vol' | sha256sum
            (
                ephemeral_volume_handle("uid-1", "vol"),
                "csi-67efd08187334bc4caecc2244debc613d2dae49b3b82338caf725c10f4e8a821",
            ),
        ];
        for (got, want) in rows {
            assert_eq!(got, want);
        }
        assert_ne!(ephemeral_volume_handle("uid-1", "vol"), ephemeral_volume_handle("uid-2", "vol"));
    }
}
