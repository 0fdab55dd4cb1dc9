//! A container's mounts and devices as entries of an OCI runtime's `config.json` (`mounts`, `linux.devices`): what a runner hands runc or crun; pure (a device's numbers are the caller's `stat`).

use serde_json::{Value, json};

use crate::proto::{Device, Mount, MountPropagation};

/// An OCI mount: a recursive bind of the host path, read-only or not, with the propagation
/// CRI's value asks for (runc's and crun's spelling: `rprivate`, `rslave`, `rshared`).
pub fn mount(m: &Mount) -> Value {
    let propagation =
        match MountPropagation::try_from(m.propagation).unwrap_or(MountPropagation::PropagationPrivate) {
            MountPropagation::PropagationPrivate => "rprivate",
            MountPropagation::PropagationHostToContainer => "rslave",
            MountPropagation::PropagationBidirectional => "rshared",
        };
    let access = if m.readonly { "ro" } else { "rw" };
    json!({"destination": m.container_path, "type": "bind", "source": m.host_path,
           "options": ["rbind", access, propagation]})
}

/// An OCI device: the container path, its kind (`b` block, `c` character) and numbers.
pub fn device(d: &Device, kind: char, major: u64, minor: u64) -> Value {
    json!({"path": d.container_path, "type": kind.to_string(), "major": major, "minor": minor,
           "fileMode": 0o660, "uid": 0, "gid": 0})
}

/// The cgroup rule that lets the container use a device (`linux.resources.devices`), with the
/// CRI permissions (`mrw`) as OCI access.
pub fn device_rule(d: &Device, kind: char, major: u64, minor: u64) -> Value {
    json!({"allow": true, "type": kind.to_string(), "major": major, "minor": minor, "access": d.permissions})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_become_recursive_binds_with_their_propagation() {
        let cases = [
            (false, MountPropagation::PropagationPrivate, json!(["rbind", "rw", "rprivate"])),
            (true, MountPropagation::PropagationHostToContainer, json!(["rbind", "ro", "rslave"])),
            (false, MountPropagation::PropagationBidirectional, json!(["rbind", "rw", "rshared"])),
        ];
        for (readonly, propagation, options) in cases {
            let m = Mount {
                container_path: "/data".into(),
                host_path: "/var/lib/kubelet/pods/u/volumes/x/v".into(),
                readonly,
                propagation: propagation as i32,
                ..Mount::default()
            };
            let got = mount(&m);
            assert_eq!(got["options"], options, "{propagation:?}");
            assert_eq!(got["destination"], "/data");
            assert_eq!(got["source"], "/var/lib/kubelet/pods/u/volumes/x/v");
        }
        let d = Device { container_path: "/dev/xvda".into(), permissions: "mrw".into(), ..Device::default() };
        assert_eq!(device(&d, 'b', 7, 3)["type"], "b");
        assert_eq!(device_rule(&d, 'b', 7, 3)["access"], "mrw");
    }
}
