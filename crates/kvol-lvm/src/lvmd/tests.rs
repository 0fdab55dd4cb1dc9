//! Table tests of lvmd.yaml parsing and TopoLVM's validation rules, one row per rule.

use super::*;

const FULL: &str = r#"
socket-name: /run/topolvm/lvmd.sock
lvm-command-prefix: [nsenter, -m, -u, -i, -n, -p, -t, "1"]
unknown-top-level: ignored
device-classes:
  - name: ssd
    volume-group: vg-ssd
    default: true
    spare-gb: 5
    stripe: 2
    stripe-size: 64k
    lvcreate-options: ["--type=raid1"]
  - name: thin
    volume-group: vg-ssd
    type: thin
    thin-pool:
      name: pool0
      overprovision-ratio: 5.0
lvcreate-option-classes:
  - name: raid
    options: ["--type=raid1"]
"#;

#[test]
fn parses_every_topolvm_key_and_keeps_the_ones_kvol_does_not_use() {
    let config = parse(FULL).unwrap();
    assert_eq!(config.socket_name.as_deref(), Some("/run/topolvm/lvmd.sock"));
    assert_eq!(config.lvm_command_prefix.len(), 8);
    assert_eq!(config.lvcreate_option_classes[0].name, "raid");
    let ssd = &config.device_classes[0];
    assert_eq!(
        (ssd.name.as_str(), ssd.volume_group.as_str(), ssd.default, ssd.spare_gb, ssd.stripe),
        ("ssd", "vg-ssd", true, Some(5), Some(2))
    );
    assert_eq!(ssd.stripe_size, "64k");
    assert_eq!(ssd.lvcreate_options, vec!["--type=raid1"]);
    assert_eq!(ssd.class_kind(), Some(ClassKind::Thick));
    let thin = &config.device_classes[1];
    assert_eq!(thin.class_kind(), Some(ClassKind::Thin));
    assert_eq!(thin.thin_pool, Some(ThinPool { name: "pool0".into(), overprovision_ratio: 5.0 }));
    assert_eq!(thin.target(), "vg-ssd/pool0");
    assert_eq!(config.default_class().map(|c| c.name.as_str()), Some("ssd"));
    assert!(validate(&config).is_empty(), "{:?}", validate(&config));
}

#[test]
fn rendering_round_trips_and_keeps_kept_keys() {
    let config = parse(FULL).unwrap();
    assert_eq!(parse(&render(&config)).unwrap(), config);
}

#[test]
fn omitted_spare_gb_is_ten_gib_and_explicit_zero_is_zero() {
    let omitted = parse("device-classes: [{name: a, volume-group: vg}]").unwrap();
    assert_eq!(omitted.device_classes[0].spare_bytes(), 10 << 30);
    let zero = parse("device-classes: [{name: a, volume-group: vg, spare-gb: 0}]").unwrap();
    assert_eq!(zero.device_classes[0].spare_bytes(), 0);
}

#[test]
fn undecodable_files_are_parse_errors() {
    for text in ["device-classes: 3", "device-classes: [{spare-gb: lots}]", "[1, 2"] {
        let err = parse(text).unwrap_err().to_string();
        assert!(err.starts_with("not an lvmd.yaml"), "{text}: {err}");
    }
}

fn class(name: &str, vg: &str) -> DeviceClass {
    DeviceClass { name: name.into(), volume_group: vg.into(), ..Default::default() }
}

fn thin(name: &str, vg: &str, pool: &str, ratio: f64) -> DeviceClass {
    DeviceClass {
        kind: "thin".into(),
        thin_pool: Some(ThinPool { name: pool.into(), overprovision_ratio: ratio }),
        ..class(name, vg)
    }
}

/// One row per TopoLVM rule: the classes, and the problems (rendered) expected.
#[test]
fn each_rule_reports_its_problem() {
    let long = "a".repeat(64);
    let rows: Vec<(&str, Vec<DeviceClass>, Vec<String>)> = vec![
        ("valid thick", vec![class("a", "vg")], vec![]),
        ("valid thin beside thick on one vg", vec![class("a", "vg"), thin("b", "vg", "p", 1.0)], vec![]),
        ("at least one class", vec![], vec!["device-classes: should have at least one device-class".into()]),
        ("empty name", vec![class("", "vg")], vec!["device-classes[0].name: should not be empty".into()]),
        (
            "name longer than 63",
            vec![class(&long, "vg")],
            vec![format!("device-classes[0] ({long:?}).name: is 64 characters, at most 63 allowed")],
        ),
        ("63 characters is fine", vec![class(&"a".repeat(63), "vg")], vec![]),
        (
            "name not qualified",
            vec![class("-bad", "vg")],
            vec!["device-classes[0] (\"-bad\").name: should consist of alphanumeric characters, '-', '_' or '.', and start and end with an alphanumeric character".into()],
        ),
        ("empty volume group", vec![class("a", "")], vec!["device-classes[0] (\"a\").volume-group: should not be empty".into()]),
        (
            "duplicate name",
            vec![class("a", "vg1"), class("a", "vg2")],
            vec!["device-classes[1] (\"a\").name: duplicate device-class name".into()],
        ),
        (
            "bad type",
            vec![DeviceClass { kind: "thinn".into(), ..class("a", "vg") }],
            vec!["device-classes[0] (\"a\").type: is \"thinn\"; it can be \"thick\", \"thin\" or empty (thick)".into()],
        ),
        (
            "thin without a pool",
            vec![DeviceClass { kind: "thin".into(), ..class("a", "vg") }],
            vec!["device-classes[0] (\"a\").thin-pool: type is thin but thin-pool is missing".into()],
        ),
        ("thin pool without a name", vec![thin("a", "vg", "", 2.0)], vec!["device-classes[0] (\"a\").thin-pool.name: should not be empty".into()]),
        (
            "overprovision ratio below 1",
            vec![thin("a", "vg", "p", 0.5)],
            vec!["device-classes[0] (\"a\").thin-pool.overprovision-ratio: is 0.5; it should be 1.0 or more".into()],
        ),
        (
            "two classes on one volume group",
            vec![class("a", "vg"), class("b", "vg")],
            vec!["device-classes[1] (\"b\").volume-group: volume group/thin pool vg is already the target of device-class \"a\"".into()],
        ),
        (
            "two classes on one thin pool",
            vec![thin("a", "vg", "p", 1.0), thin("b", "vg", "p", 2.0)],
            vec!["device-classes[1] (\"b\").volume-group: volume group/thin pool vg/p is already the target of device-class \"a\"".into()],
        ),
        (
            "several defaults",
            vec![DeviceClass { default: true, ..class("a", "vg1") }, DeviceClass { default: true, ..class("b", "vg2") }],
            vec!["default: should not have multiple default device-classes: a, b".into()],
        ),
        ("stripe size with a unit", vec![DeviceClass { stripe_size: "4M".into(), ..class("a", "vg") }], vec![]),
        (
            "stripe size malformed",
            vec![DeviceClass { stripe_size: "4 MiB".into(), ..class("a", "vg") }],
            vec!["device-classes[0] (\"a\").stripe-size: is \"4 MiB\"; the format is Size[k|UNIT]".into()],
        ),
        ("a thin pool on a thick class is ignored", vec![DeviceClass { thin_pool: Some(ThinPool::default()), ..class("a", "vg") }], vec![]),
    ];
    for (row, classes, expected) in rows {
        let config = LvmdConfig { device_classes: classes, ..Default::default() };
        let got: Vec<String> = validate(&config).iter().map(ToString::to_string).collect();
        assert_eq!(got, expected, "row: {row}");
    }
}

#[test]
fn every_problem_is_collected_not_only_the_first() {
    let text = r#"
device-classes:
  - name: ""
    volume-group: ""
  - name: x
    volume-group: vg
    type: thin
    default: true
    stripe-size: nope
  - name: x
    volume-group: vg2
    default: true
"#;
    let problems: Vec<String> = validate(&parse(text).unwrap()).iter().map(ToString::to_string).collect();
    assert_eq!(
        problems,
        vec![
            "device-classes[0].name: should not be empty",
            "device-classes[0].volume-group: should not be empty",
            "device-classes[1] (\"x\").thin-pool: type is thin but thin-pool is missing",
            "device-classes[1] (\"x\").stripe-size: is \"nope\"; the format is Size[k|UNIT]",
            "device-classes[2] (\"x\").name: duplicate device-class name",
            "default: should not have multiple default device-classes: x, x",
        ]
    );
}
