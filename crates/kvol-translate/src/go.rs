//! Go semantics the translation must reproduce: zero values, and `strings.ToLower` key matching.
//!
//! Upstream's sources hold plain Go `bool`, `string` and `int32` fields (`omitempty`), so
//! `readOnly: false`, `fsType: ""` and `partition: 0` cannot exist there: they are simply unset.
//! k8s-openapi has `Option`s that can hold them, so translators write such fields through
//! [`zero_bool`] and [`zero_string`], and the dispatcher clears them from the source a
//! translation produced ([`clear_csi_zeros`], [`clear_in_tree_zeros`]). Fields that are pointers
//! in Go (Azure Disk's `readOnly`, `fsType`, `cachingMode`, `kind`; Azure File's
//! `secretNamespace`) keep their value: Go keeps a pointer to `false` or `""` too.

use k8s_openapi::api::core::v1::{PersistentVolumeSpec, SecretReference};

/// A Go `bool` field: `false` is absent.
pub(crate) fn zero_bool(value: Option<bool>) -> Option<bool> {
    value.filter(|&b| b)
}

/// A Go `string` field: `""` is absent.
pub(crate) fn zero_string(value: Option<String>) -> Option<String> {
    value.filter(|s| !s.is_empty())
}

fn clear_bool(v: &mut Option<bool>) {
    if *v == Some(false) {
        *v = None;
    }
}

fn clear_string(v: &mut Option<String>) {
    if v.as_deref() == Some("") {
        *v = None;
    }
}

fn clear_int(v: &mut Option<i32>) {
    if *v == Some(0) {
        *v = None;
    }
}

fn clear_secret(r: &mut Option<SecretReference>) {
    if let Some(r) = r.as_mut() {
        clear_string(&mut r.name);
        clear_string(&mut r.namespace);
    }
}

/// Clears Go zero values from the CSI source of a spec produced by an in-tree → CSI translation.
pub(crate) fn clear_csi_zeros(spec: &mut PersistentVolumeSpec) {
    if let Some(csi) = spec.csi.as_mut() {
        clear_bool(&mut csi.read_only);
        clear_string(&mut csi.fs_type);
        clear_secret(&mut csi.controller_expand_secret_ref);
        clear_secret(&mut csi.controller_publish_secret_ref);
        clear_secret(&mut csi.node_expand_secret_ref);
        clear_secret(&mut csi.node_publish_secret_ref);
        clear_secret(&mut csi.node_stage_secret_ref);
    }
}

/// Clears Go zero values from the in-tree source of a spec produced by a CSI → in-tree translation.
pub(crate) fn clear_in_tree_zeros(spec: &mut PersistentVolumeSpec) {
    if let Some(s) = spec.aws_elastic_block_store.as_mut() {
        clear_string(&mut s.fs_type);
        clear_int(&mut s.partition);
        clear_bool(&mut s.read_only);
    }
    if let Some(s) = spec.gce_persistent_disk.as_mut() {
        clear_string(&mut s.fs_type);
        clear_int(&mut s.partition);
        clear_bool(&mut s.read_only);
    }
    if let Some(s) = spec.azure_file.as_mut() {
        clear_bool(&mut s.read_only);
    }
    if let Some(s) = spec.cinder.as_mut() {
        clear_string(&mut s.fs_type);
        clear_bool(&mut s.read_only);
    }
    if let Some(s) = spec.vsphere_volume.as_mut() {
        clear_string(&mut s.fs_type);
        clear_string(&mut s.storage_policy_name);
        clear_string(&mut s.storage_policy_id);
    }
    if let Some(s) = spec.portworx_volume.as_mut() {
        clear_string(&mut s.fs_type);
        clear_bool(&mut s.read_only);
    }
    if let Some(s) = spec.rbd.as_mut() {
        clear_string(&mut s.fs_type);
        clear_string(&mut s.pool);
        clear_string(&mut s.user);
        clear_string(&mut s.keyring);
        clear_bool(&mut s.read_only);
        clear_secret(&mut s.secret_ref);
    }
}

/// One character lower-cased as Go's `unicode.ToLower` does, when the result is ASCII. Besides
/// ASCII, only `İ` (U+0130, to `i`) and the Kelvin sign (U+212A, to `k`) lower-case to ASCII.
fn go_lower_ascii(c: char) -> Option<u8> {
    match c {
        '\u{130}' => Some(b'i'),
        '\u{212a}' => Some(b'k'),
        c if c.is_ascii() => Some((c as u8).to_ascii_lowercase()),
        _ => None,
    }
}

/// Whether `key` equals `lower` (lower-case ASCII) after Go's `strings.ToLower`, without allocating.
/// Upstream matches StorageClass parameter keys this way.
pub(crate) fn key_is(key: &str, lower: &str) -> bool {
    let mut want = lower.bytes();
    for c in key.chars() {
        if go_lower_ascii(c).is_none() || want.next() != go_lower_ascii(c) {
            return false;
        }
    }
    want.next().is_none()
}

/// `key` lower-cased as Go's `strings.ToLower` does, if the result is ASCII and fits `buf`;
/// keys that do not lower-case to ASCII of that length match no known key.
pub(crate) fn go_ascii_lower<'b>(key: &str, buf: &'b mut [u8]) -> Option<&'b str> {
    let mut len = 0;
    for c in key.chars() {
        *buf.get_mut(len)? = go_lower_ascii(c)?;
        len += 1;
    }
    std::str::from_utf8(buf.get(..len)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{AzureDiskVolumeSource, CSIPersistentVolumeSource};

    #[test]
    fn keys_match_as_go_lower_cases_them() {
        // (key, lower-case target, equal?)
        let cases = [
            ("FSType", "fstype", true),
            ("fstype", "fstype", true),
            ("fstype ", "fstype", false),
            ("fstyp", "fstype", false),
            ("IOPSPERGB", "iopspergb", true),
            ("\u{130}opsPerGB", "iopspergb", true),
            ("\u{212a}ind", "kind", true),
            ("\u{0131}opspergb", "iopspergb", false),
            ("", "", true),
        ];
        for (key, lower, want) in cases {
            assert_eq!(key_is(key, lower), want, "{key:?} vs {lower:?}");
            let mut buf = [0u8; 16];
            assert_eq!(go_ascii_lower(key, &mut buf) == Some(lower), want, "{key:?}");
        }
        let mut small = [0u8; 2];
        assert_eq!(go_ascii_lower("abc", &mut small), None);
    }

    #[test]
    fn zero_values_go_and_pointer_fields_stay() {
        let mut spec = PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                read_only: Some(false),
                fs_type: Some(String::new()),
                node_stage_secret_ref: Some(SecretReference { name: Some(String::new()), namespace: None }),
                ..Default::default()
            }),
            ..Default::default()
        };
        clear_csi_zeros(&mut spec);
        assert_eq!(
            spec.csi,
            Some(CSIPersistentVolumeSource {
                node_stage_secret_ref: Some(SecretReference::default()),
                ..Default::default()
            })
        );
        let disk = AzureDiskVolumeSource {
            read_only: Some(false),
            fs_type: Some(String::new()),
            ..Default::default()
        };
        let mut spec = PersistentVolumeSpec { azure_disk: Some(disk.clone()), ..Default::default() };
        clear_in_tree_zeros(&mut spec);
        assert_eq!(spec.azure_disk, Some(disk));
        assert_eq!(zero_bool(Some(false)), None);
        assert_eq!(zero_string(Some("x".into())), Some("x".into()));
    }
}
