//! Table tests for the component decision: every MicroShift inconsistency in the reference is a row.

use super::*;

enum Expect {
    /// Components that run, components blocked, and words each warning must contain (in order).
    Decided {
        run: &'static [&'static str],
        blocked: &'static [&'static str],
        warnings: &'static [&'static str],
    },
    /// Words each problem must contain, in order; no more problems than these.
    Rejected(&'static [&'static str]),
}
use Expect::*;

struct Row {
    what: &'static str,
    storage: &'static str,
    volume_group: bool,
    expect: Expect,
}

const fn row(what: &'static str, storage: &'static str, volume_group: bool, expect: Expect) -> Row {
    Row { what, storage, volume_group, expect }
}

const ROWS: &[Row] = &[
    row(
        "nothing written: the node's default driver and snapshots",
        "{}",
        false,
        Decided { run: &["hostpath", "snapshot-controller"], blocked: &[], warnings: &[] },
    ),
    row(
        "a volume group makes lvm the default, as LVMS on MicroShift",
        "{}",
        true,
        Decided { run: &["lvm", "snapshot-controller"], blocked: &[], warnings: &[] },
    ),
    row(
        "driver \"\" is unset (clusters upgraded without a storage section)",
        "driver: \"\"",
        true,
        Decided { run: &["lvm", "snapshot-controller"], blocked: &[], warnings: &[] },
    ),
    row(
        "driver none keeps the snapshot controller, as MicroShift's e2e asserts",
        "driver: none",
        true,
        Decided { run: &["snapshot-controller"], blocked: &[], warnings: &[] },
    ),
    row(
        "a named driver the node cannot run is blocked, not an error",
        "driver: lvm",
        false,
        Decided { run: &["snapshot-controller"], blocked: &["lvm"], warnings: &[] },
    ),
    row(
        "hostpath chosen on a node with a volume group",
        "driver: hostpath",
        true,
        Decided { run: &["hostpath", "snapshot-controller"], blocked: &[], warnings: &[] },
    ),
    row(
        "[] means the default, and says how to turn it off",
        "optionalCsiComponents: []",
        false,
        Decided {
            run: &["hostpath", "snapshot-controller"],
            blocked: &[],
            warnings: &["empty list means the default (snapshot-controller); write [none]"],
        },
    ),
    row(
        "[\"\"] (controller-gen's default) means the same as []",
        "optionalCsiComponents: [\"\"]",
        false,
        Decided {
            run: &["hostpath", "snapshot-controller"],
            blocked: &[],
            warnings: &["empty list means the default"],
        },
    ),
    row(
        "[null] reads as [\"\"]",
        "optionalCsiComponents: [~]",
        false,
        Decided {
            run: &["hostpath", "snapshot-controller"],
            blocked: &[],
            warnings: &["empty list means the default"],
        },
    ),
    row(
        "[none] is the opt-out",
        "optionalCsiComponents: [none]",
        false,
        Decided { run: &["hostpath"], blocked: &[], warnings: &[] },
    ),
    row(
        "none and nothing at all",
        "{driver: none, optionalCsiComponents: [none]}",
        true,
        Decided { run: &[], blocked: &[], warnings: &[] },
    ),
    row(
        "MicroShift accepted [none, snapshot-controller]; here none stands alone",
        "optionalCsiComponents: [none, snapshot-controller]",
        false,
        Rejected(&[
            "storage.optionalCsiComponents: none stands alone, but the list also has snapshot-controller",
        ]),
    ),
    row(
        "MicroShift skipped validation with driver none; unknown names are still rejected",
        "{driver: none, optionalCsiComponents: [snapshot-controler]}",
        false,
        Rejected(&[
            "storage.optionalCsiComponents: unknown component \"snapshot-controler\" (known: snapshot-controller, or none)",
        ]),
    ),
    row(
        "unknown names beside none are rejected too",
        "optionalCsiComponents: [none, bogus]",
        false,
        Rejected(&["none stands alone, but the list also has bogus", "unknown component \"bogus\""]),
    ),
    row(
        "the docs' csi-snapshot-controller is accepted as its former name",
        "optionalCsiComponents: [csi-snapshot-controller]",
        false,
        Decided {
            run: &["hostpath", "snapshot-controller"],
            blocked: &[],
            warnings: &[
                "\"csi-snapshot-controller\" is a former name of \"snapshot-controller\" (the name MicroShift's enhancement text used); write snapshot-controller",
            ],
        },
    ),
    row(
        "snapshot-webhook, removed upstream, is accepted with a warning rather than failing the upgrade",
        "optionalCsiComponents: [snapshot-webhook, snapshot-controller]",
        false,
        Decided {
            run: &["hostpath", "snapshot-controller"],
            blocked: &[],
            warnings: &[
                "\"snapshot-webhook\" is retired and nothing runs for it (the validation webhook was removed upstream",
            ],
        },
    ),
    row(
        "snapshot-webhook alone runs no optional component",
        "optionalCsiComponents: [snapshot-webhook]",
        false,
        Decided { run: &["hostpath"], blocked: &[], warnings: &["retired"] },
    ),
    row(
        "a name twice (once by its former name) is one component",
        "optionalCsiComponents: [snapshot-controller, csi-snapshot-controller]",
        false,
        Decided {
            run: &["hostpath", "snapshot-controller"],
            blocked: &[],
            warnings: &["former name", "listed more than once"],
        },
    ),
    row(
        "an unknown driver lists the known ones",
        "driver: lvms",
        false,
        Rejected(&["storage.driver: unknown driver \"lvms\" (known: hostpath, lvm, or none)"]),
    ),
    row(
        "an optional component is not a driver",
        "driver: snapshot-controller",
        false,
        Rejected(&[
            "storage.driver: \"snapshot-controller\" is an optional component, not a driver: list it in storage.optionalCsiComponents",
        ]),
    ),
    row(
        "a driver is not an optional component",
        "optionalCsiComponents: [lvm]",
        true,
        Rejected(&[
            "storage.optionalCsiComponents: \"lvm\" is a driver, not an optional component: set storage.driver: lvm",
        ]),
    ),
    row(
        "every problem at once",
        "{driver: nfs, optionalCsiComponents: [none, hostpath, x]}",
        false,
        Rejected(&[
            "unknown driver \"nfs\"",
            "none stands alone, but the list also has hostpath, x",
            "\"hostpath\" is a driver",
            "unknown component \"x\"",
        ]),
    ),
];

fn storage(text: &str) -> StorageSection {
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn facts(volume_group: bool) -> NodeFacts {
    NodeFacts { features: if volume_group { [NodeFeature::LvmVolumeGroup].into() } else { BTreeSet::new() } }
}

#[test]
fn the_rules_table() {
    let catalogue = Catalogue::built_in();
    for row in ROWS {
        let result = decide(&storage(row.storage), &catalogue, &facts(row.volume_group));
        match (&row.expect, result) {
            (Decided { run, blocked, warnings }, Ok(decision)) => {
                let running: Vec<&str> = decision.running().collect();
                assert_eq!(&running, run, "{}: running\n{decision}", row.what);
                let held: Vec<&str> = decision
                    .verdicts
                    .iter()
                    .filter(|(_, v)| matches!(v, Verdict::Blocked(_)))
                    .map(|(n, _)| n.as_str())
                    .collect();
                assert_eq!(&held, blocked, "{}: blocked\n{decision}", row.what);
                assert_words(row.what, &decision.warnings, warnings);
            }
            (Rejected(words), Err(problems)) => {
                let text: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
                assert_words(row.what, &text, words);
            }
            (Decided { .. }, Err(problems)) => panic!("{}: rejected: {problems:?}", row.what),
            (Rejected(_), Ok(decision)) => panic!("{}: accepted:\n{decision}", row.what),
        }
    }
}

fn assert_words(what: &str, lines: &[String], words: &[&str]) {
    assert_eq!(lines.len(), words.len(), "{what}: {lines:#?}");
    for (line, words) in lines.iter().zip(words) {
        assert!(line.contains(words), "{what}: {line:?} should contain {words:?}");
    }
}

#[test]
fn verdicts_say_why() {
    let catalogue = Catalogue::built_in();
    let decision = decide(&storage("driver: lvm"), &catalogue, &facts(false)).unwrap();
    assert_eq!(
        decision.verdict("lvm"),
        Some(&Verdict::Blocked(
            "storage.driver is lvm, but the node has no LVM volume group (or no lvm2 tools)".into()
        ))
    );
    assert_eq!(decision.verdict("hostpath"), Some(&Verdict::Off("storage.driver is lvm".into())));
    let decision = decide(&storage("{}"), &catalogue, &facts(true)).unwrap();
    assert_eq!(
        decision.to_string(),
        "hostpath: off: storage.driver is unset and this node's default driver is lvm\n\
         lvm: run: storage.driver is unset and lvm is this node's default driver\n\
         snapshot-controller: run: storage.optionalCsiComponents is unset or empty and snapshot-controller is on by default\n"
    );
}

#[test]
fn user_definitions_take_part_in_the_decision() {
    use crate::catalogue::Origin;
    let nfs = "name: nfs\nrole: driver\nprovides: {csiDriver: nfs.csi.k8s.io}\ndefaultRank: 30\n";
    let origin = Origin::File("/etc/kvol/components/nfs.yaml".into());
    let (catalogue, problems) = Catalogue::with_documents(vec![(origin, nfs.to_string())]);
    assert!(problems.is_empty(), "{problems:?}");
    // The highest-ranked default has no standalone definition: wanted, but blocked, with the file named.
    let decision = decide(&storage("{}"), &catalogue, &facts(false)).unwrap();
    assert_eq!(
        decision.verdict("nfs"),
        Some(&Verdict::Blocked(
            "storage.driver is unset and nfs is this node's default driver, but its definition \
             (/etc/kvol/components/nfs.yaml) says nothing about running standalone"
                .into()
        ))
    );
    let err = decide(&storage("driver: nope"), &catalogue, &facts(false)).unwrap_err();
    assert!(err[0].message.contains("(known: hostpath, lvm, nfs, or none)"), "{err:?}");
}
