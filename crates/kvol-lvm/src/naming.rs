//! Volume and snapshot ids derived from CSI names, and the lvm tags that tie a logical volume to its driver, name and class (pure).
//!
//! A logical volume's name is its CSI id (`vol-<hash>` or `snap-<hash>` of the CSI name), and
//! the LV carries tags set atomically by the `lvcreate` that makes it: `kvol.driver=<driver>`,
//! `kvol.name=<encoded CSI name>`, `kvol.class=<device class>`, and for a volume made from a
//! snapshot or a snapshot of a volume `kvol.source=<id>`. lvm tags may hold only
//! `[A-Za-z0-9_+.\-/=!:&#]`, so the CSI name is encoded: every byte outside
//! `[A-Za-z0-9+.-]` is written `_` and two hex digits.

use sha2::{Digest, Sha256};

/// The tag prefix of the driver that owns a logical volume.
pub const DRIVER_TAG: &str = "kvol.driver=";
/// The tag prefix of a logical volume's CSI name (encoded).
pub const NAME_TAG: &str = "kvol.name=";
/// The tag prefix of the device class a logical volume was made in.
pub const CLASS_TAG: &str = "kvol.class=";
/// The tag prefix of the volume or snapshot a logical volume was made from.
pub const SOURCE_TAG: &str = "kvol.source=";
/// The prefix of a volume id (and of its LV's name).
pub const VOLUME_PREFIX: &str = "vol-";
/// The prefix of a snapshot id (and of its LV's name).
pub const SNAPSHOT_PREFIX: &str = "snap-";

fn hashed(prefix: &str, name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{hex}")
}

/// The id (and LV name) of the volume whose CSI name is `name`.
pub fn volume_id(name: &str) -> String {
    hashed(VOLUME_PREFIX, name)
}

/// The id (and LV name) of the snapshot whose CSI name is `name`.
pub fn snapshot_id(name: &str) -> String {
    hashed(SNAPSHOT_PREFIX, name)
}

/// Whether `id` has the shape of an id this driver makes (`prefix` and 32 hex digits).
pub fn is_id(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix).is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// `name` in lvm's tag alphabet: bytes outside `[A-Za-z0-9+.-]` become `_` and two hex digits.
pub fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'+' | b'.' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("_{b:02x}"));
        }
    }
    out
}

/// The name [`encode`] encoded; `None` when `text` is not an encoding.
pub fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'_' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The tags a new logical volume gets: driver, name, class, and its source when it has one.
pub fn tags(driver: &str, name: &str, class: &str, source: Option<&str>) -> Vec<String> {
    let mut tags = vec![
        format!("{DRIVER_TAG}{driver}"),
        format!("{NAME_TAG}{}", encode(name)),
        format!("{CLASS_TAG}{class}"),
    ];
    if let Some(source) = source {
        tags.push(format!("{SOURCE_TAG}{source}"));
    }
    tags
}

/// The value of the tag starting with `prefix` among `tags`.
pub fn tag_value<'a>(tags: &'a [String], prefix: &str) -> Option<&'a str> {
    tags.iter().find_map(|t| t.strip_prefix(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_the_tag_alphabet() {
        let allowed = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_+.-/=!:&#".contains(&b));
        let rows = [
            ("pvc-0a1b", "pvc-0a1b"),
            ("my_volume", "my_5fvolume"),
            ("a b/c", "a_20b_2fc"),
            ("ünï", "_c3_bcn_c3_af"),
            ("", ""),
            ("x+y.z", "x+y.z"),
        ];
        for (name, encoded) in rows {
            assert_eq!(encode(name), encoded, "{name}");
            assert!(allowed(&encode(name)), "{name}");
            assert_eq!(decode(encoded).as_deref(), Some(name), "{encoded}");
        }
        for bad in ["_", "_4", "_zz", "_ff"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn ids_are_stable_shaped_and_distinct() {
        let v = volume_id("pvc-1");
        assert_eq!(v, volume_id("pvc-1"));
        assert_ne!(v, volume_id("pvc-2"));
        assert!(is_id(&v, VOLUME_PREFIX), "{v}");
        assert!(is_id(&snapshot_id("s"), SNAPSHOT_PREFIX));
        let rows = [
            ("vol-0123456789abcdef0123456789abcdef", VOLUME_PREFIX, true),
            ("vol-0123", VOLUME_PREFIX, false),
            ("snap-0123456789abcdef0123456789abcdef", VOLUME_PREFIX, false),
            ("vol-0123456789abcdef0123456789abcdeg", VOLUME_PREFIX, false),
        ];
        for (id, prefix, want) in rows {
            assert_eq!(is_id(id, prefix), want, "{id}");
        }
    }

    #[test]
    fn tags_carry_driver_name_class_and_source() {
        let t = tags("lvm.csi.kvol.io", "pvc 1", "ssd", Some("snap-x"));
        assert_eq!(
            t,
            ["kvol.driver=lvm.csi.kvol.io", "kvol.name=pvc_201", "kvol.class=ssd", "kvol.source=snap-x"]
        );
        assert_eq!(tag_value(&t, CLASS_TAG), Some("ssd"));
        assert_eq!(tag_value(&t[..3], SOURCE_TAG), None);
    }
}
