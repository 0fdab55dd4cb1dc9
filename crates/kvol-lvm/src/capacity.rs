//! Sizes: a requested capacity rounded to whole extents, and what a device class has left — thick: the VG's free space less spare-gb; thin: the pool times its overprovision ratio less what its volumes promise (pure).

use crate::lvmd::{ClassKind, DeviceClass};

/// The size of a volume made with no capacity asked for (TopoLVM's default too).
pub const DEFAULT_VOLUME_BYTES: u64 = 1 << 30;

/// The size a volume asking for `required`..=`limit` bytes (0: unset) gets in a volume group
/// of `extent`-byte extents: the required bytes (or the default, within the limit) rounded up to
/// an extent.
pub fn volume_size(required: i64, limit: i64, extent: u64) -> Result<u64, String> {
    if required < 0 || limit < 0 {
        return Err(format!("capacity range {required}..{limit} has a negative bound"));
    }
    if limit > 0 && required > limit {
        return Err(format!("required bytes {required} are more than the limit {limit}"));
    }
    let (required, limit) = (required as u64, limit as u64);
    let extent = extent.max(1);
    let wanted = match (required, limit) {
        (0, 0) => DEFAULT_VOLUME_BYTES,
        (0, l) => DEFAULT_VOLUME_BYTES.min(l),
        (r, _) => r,
    };
    let rounded = wanted.div_ceil(extent) * extent;
    if limit > 0 && rounded > limit {
        let down = limit / extent * extent;
        if down == 0 || down < required {
            return Err(format!(
                "no whole number of {extent}-byte extents lies in {required}..={limit} bytes"
            ));
        }
        return Ok(down);
    }
    Ok(rounded)
}

/// Whether an existing volume of `size` bytes answers a request for `required`..=`limit` bytes.
pub fn size_fits(size: u64, required: i64, limit: i64) -> bool {
    size >= required.max(0) as u64 && (limit <= 0 || size <= limit as u64)
}

/// What lvm says about the space a class draws on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// A thick class: its volume group's free bytes.
    Thick { vg_free: u64 },
    /// A thin class: its pool's size, and the sizes of the thin volumes in it added up.
    Thin { pool_size: u64, virtual_used: u64 },
}

/// The bytes a class can still give new volumes: thick, the free space less `spare-gb`; thin,
/// the pool times the overprovision ratio less what the pool's volumes already promise.
pub fn available(class: &DeviceClass, space: Space) -> u64 {
    match space {
        Space::Thick { vg_free } => vg_free.saturating_sub(class.spare_bytes()),
        Space::Thin { pool_size, virtual_used } => {
            let ratio = class.thin_pool.as_ref().map_or(1.0, |p| p.overprovision_ratio);
            let promised = (pool_size as f64 * ratio) as u64;
            promised.saturating_sub(virtual_used)
        }
    }
}

/// Why `extra` more bytes cannot come from class `class` with `space`, if they cannot.
pub fn shortage(class: &DeviceClass, space: Space, extra: u64) -> Option<String> {
    let left = available(class, space);
    if extra <= left {
        return None;
    }
    Some(match (class.class_kind(), space) {
        (Some(ClassKind::Thin), Space::Thin { pool_size, virtual_used }) => format!(
            "device class {} has {left} bytes left (thin pool {}/{} of {pool_size} bytes, overprovision ratio {}, {virtual_used} bytes promised), less than the {extra} bytes asked for",
            class.name,
            class.volume_group,
            class.thin_pool.as_ref().map_or("", |p| p.name.as_str()),
            class.thin_pool.as_ref().map_or(1.0, |p| p.overprovision_ratio),
        ),
        _ => format!(
            "device class {} has {left} bytes left in volume group {} (spare {} bytes kept), less than the {extra} bytes asked for",
            class.name,
            class.volume_group,
            class.spare_bytes()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lvmd::ThinPool;

    const MIB: i64 = 1 << 20;
    const EXT: u64 = 4 << 20;

    #[test]
    fn sizes_round_up_to_extents_within_the_limit() {
        let rows: &[(i64, i64, Result<u64, &str>)] = &[
            (0, 0, Ok(DEFAULT_VOLUME_BYTES)),
            (1, 0, Ok(EXT)),
            (4 * MIB, 0, Ok(EXT)),
            (5 * MIB, 0, Ok(2 * EXT)),
            (0, 10 * MIB, Ok(2 * EXT)),
            (0, 12 * MIB, Ok(3 * EXT)),
            (0, 9 * MIB, Ok(2 * EXT)),
            (5 * MIB, 9 * MIB, Ok(2 * EXT)),
            (
                5 * MIB,
                7 * MIB,
                Err("no whole number of 4194304-byte extents lies in 5242880..=7340032 bytes"),
            ),
            (0, MIB, Err("no whole number of 4194304-byte extents lies in 0..=1048576 bytes")),
            (10 * MIB, 5 * MIB, Err("required bytes 10485760 are more than the limit 5242880")),
            (-1, 0, Err("capacity range -1..0 has a negative bound")),
        ];
        for (required, limit, want) in rows {
            let got = volume_size(*required, *limit, EXT);
            assert_eq!(got, (*want).map_err(str::to_string), "{required}..{limit}");
        }
    }

    #[test]
    fn existing_sizes_fit_or_not() {
        let rows = [(8, 4, 0, true), (8, 8, 8, true), (8, 9, 0, false), (8, 0, 7, false), (8, -1, -1, true)];
        for (size, required, limit, want) in rows {
            assert_eq!(size_fits(size, required, limit), want, "{size} in {required}..{limit}");
        }
    }

    fn thick(spare_gb: Option<u64>) -> DeviceClass {
        DeviceClass { name: "hdd".into(), volume_group: "vg0".into(), spare_gb, ..Default::default() }
    }

    fn thin(ratio: f64) -> DeviceClass {
        DeviceClass {
            name: "fast".into(),
            volume_group: "vg0".into(),
            kind: "thin".into(),
            thin_pool: Some(ThinPool { name: "pool".into(), overprovision_ratio: ratio }),
            ..Default::default()
        }
    }

    #[test]
    fn classes_have_what_is_left_after_spare_or_overprovision() {
        const GIB: u64 = 1 << 30;
        let rows = [
            (thick(Some(0)), Space::Thick { vg_free: 5 * GIB }, 5 * GIB),
            (thick(Some(2)), Space::Thick { vg_free: 5 * GIB }, 3 * GIB),
            (thick(None), Space::Thick { vg_free: 5 * GIB }, 0),
            (thin(1.0), Space::Thin { pool_size: GIB, virtual_used: 0 }, GIB),
            (thin(3.0), Space::Thin { pool_size: GIB, virtual_used: 2 * GIB }, GIB),
            (thin(2.5), Space::Thin { pool_size: 2 * GIB, virtual_used: 0 }, 5 * GIB),
            (thin(2.0), Space::Thin { pool_size: GIB, virtual_used: 3 * GIB }, 0),
        ];
        for (class, space, want) in rows {
            assert_eq!(available(&class, space), want, "{class:?} {space:?}");
        }
    }

    #[test]
    fn shortages_name_the_class_and_the_numbers() {
        let space = Space::Thin { pool_size: 100, virtual_used: 150 };
        assert_eq!(shortage(&thin(2.0), space, 50), None);
        assert_eq!(
            shortage(&thin(2.0), space, 51).unwrap(),
            "device class fast has 50 bytes left (thin pool vg0/pool of 100 bytes, overprovision ratio 2, 150 bytes promised), less than the 51 bytes asked for"
        );
        assert_eq!(
            shortage(&thick(Some(0)), Space::Thick { vg_free: 10 }, 11).unwrap(),
            "device class hdd has 10 bytes left in volume group vg0 (spare 0 bytes kept), less than the 11 bytes asked for"
        );
    }
}
