//! Whether a changed lvmd.yaml may replace the running one: a change that would orphan logical volumes the driver owns (their class removed, or its volume group or thin pool changed) is refused (pure).

use std::collections::BTreeMap;

use crate::lvmd::LvmdConfig;

/// Where the driver's logical volumes are: per target (`vg`, or `vg/pool` for thin volumes),
/// how many.
pub type Owned = BTreeMap<String, usize>;

/// The target an owned logical volume counts under: its pool's `vg/pool`, else its VG.
pub fn target_of(vg: &str, pool: Option<&str>) -> String {
    match pool {
        Some(pool) => format!("{vg}/{pool}"),
        None => vg.to_string(),
    }
}

/// The verdict on a new configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing a volume depends on changed: apply it.
    Apply,
    /// The same configuration: nothing to do.
    Unchanged,
    /// Applying it would orphan volumes: every reason, the running configuration stays.
    Refuse(Vec<String>),
}

/// The verdict on replacing `running` by `next` while the driver owns `owned` volumes: every
/// running class whose target holds volumes must stay, under the same name, on the same target.
pub fn decide(running: &LvmdConfig, next: &LvmdConfig, owned: &Owned) -> Verdict {
    if running == next {
        return Verdict::Unchanged;
    }
    let mut reasons = Vec::new();
    for class in &running.device_classes {
        let target = class.target();
        let Some(&count) = owned.get(&target).filter(|n| **n > 0) else { continue };
        match next.class(&class.name) {
            None => reasons.push(format!(
                "device class {} is removed, and {target} holds {count} of the driver's logical volumes",
                class.name
            )),
            Some(new) if new.target() != target => reasons.push(format!(
                "device class {} moves from {target} to {}, and {target} holds {count} of the driver's logical volumes",
                class.name,
                new.target()
            )),
            Some(_) => {}
        }
    }
    if reasons.is_empty() { Verdict::Apply } else { Verdict::Refuse(reasons) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lvmd::{DeviceClass, ThinPool};

    fn thick(name: &str, vg: &str) -> DeviceClass {
        DeviceClass { name: name.into(), volume_group: vg.into(), spare_gb: Some(0), ..Default::default() }
    }

    fn thin(name: &str, vg: &str, pool: &str) -> DeviceClass {
        DeviceClass {
            kind: "thin".into(),
            thin_pool: Some(ThinPool { name: pool.into(), overprovision_ratio: 2.0 }),
            ..thick(name, vg)
        }
    }

    fn config(classes: Vec<DeviceClass>) -> LvmdConfig {
        LvmdConfig { device_classes: classes, ..Default::default() }
    }

    fn owned(rows: &[(&str, usize)]) -> Owned {
        rows.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    }

    #[test]
    fn changes_that_would_orphan_volumes_are_refused() {
        let a = thick("a", "vg0");
        let t = thin("t", "vg0", "pool");
        let rows: Vec<(&str, LvmdConfig, LvmdConfig, Owned, Verdict)> = vec![
            ("same file", config(vec![a.clone()]), config(vec![a.clone()]), owned(&[("vg0", 3)]), Verdict::Unchanged),
            (
                "a class added",
                config(vec![a.clone()]),
                config(vec![a.clone(), t.clone()]),
                owned(&[("vg0", 1)]),
                Verdict::Apply,
            ),
            (
                "spare changed on a class with volumes",
                config(vec![a.clone()]),
                config(vec![DeviceClass { spare_gb: Some(5), ..a.clone() }]),
                owned(&[("vg0", 1)]),
                Verdict::Apply,
            ),
            ("an empty class removed", config(vec![a.clone(), t.clone()]), config(vec![a.clone()]), owned(&[("vg0", 2)]), Verdict::Apply),
            (
                "a class with volumes removed",
                config(vec![a.clone(), t.clone()]),
                config(vec![a.clone()]),
                owned(&[("vg0/pool", 2)]),
                Verdict::Refuse(vec![
                    "device class t is removed, and vg0/pool holds 2 of the driver's logical volumes".into(),
                ]),
            ),
            (
                "a class with volumes moved to another vg",
                config(vec![a.clone()]),
                config(vec![thick("a", "vg1")]),
                owned(&[("vg0", 1)]),
                Verdict::Refuse(vec![
                    "device class a moves from vg0 to vg1, and vg0 holds 1 of the driver's logical volumes".into(),
                ]),
            ),
            (
                "a thin class with volumes moved to another pool",
                config(vec![t.clone()]),
                config(vec![thin("t", "vg0", "pool2")]),
                owned(&[("vg0/pool", 4)]),
                Verdict::Refuse(vec![
                    "device class t moves from vg0/pool to vg0/pool2, and vg0/pool holds 4 of the driver's logical volumes".into(),
                ]),
            ),
            (
                "an empty class moved",
                config(vec![a.clone()]),
                config(vec![thick("a", "vg1")]),
                owned(&[("vg0", 0), ("vg2", 5)]),
                Verdict::Apply,
            ),
            (
                "two orphaned classes, both named",
                config(vec![a.clone(), t.clone()]),
                config(vec![thick("b", "vg9")]),
                owned(&[("vg0", 1), ("vg0/pool", 1)]),
                Verdict::Refuse(vec![
                    "device class a is removed, and vg0 holds 1 of the driver's logical volumes".into(),
                    "device class t is removed, and vg0/pool holds 1 of the driver's logical volumes".into(),
                ]),
            ),
        ];
        for (what, running, next, owned, want) in rows {
            assert_eq!(decide(&running, &next, &owned), want, "{what}");
        }
    }

    #[test]
    fn volumes_count_under_their_pool_or_group() {
        assert_eq!(target_of("vg0", Some("pool")), "vg0/pool");
        assert_eq!(target_of("vg0", None), "vg0");
        assert_eq!(thin("t", "vg0", "pool").target(), target_of("vg0", Some("pool")));
    }
}
