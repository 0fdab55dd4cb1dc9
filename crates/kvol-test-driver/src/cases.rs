//! The case table: each case kvol runs, the upstream suite and test it mirrors, what it needs of the definition and the driver, and the reason it is skipped otherwise; pure.

use crate::definition::DriverDefinition;

/// What a case needs before it can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// A storage class in the definition (dynamic provisioning).
    StorageClass,
    /// A snapshot class in the definition.
    SnapshotClass,
    /// `InlineVolumes` in the definition.
    InlineVolumes,
    /// `SupportedMountOption` in the definition.
    MountOptions,
    /// The capability set to true in `DriverInfo.Capabilities`.
    Capability(&'static str),
    /// kvol starts the driver (`--driver-command`), so it can restart it.
    DriverCommand,
    /// The driver's node service answers NodeGetVolumeStats (`GET_VOLUME_STATS`).
    VolumeStats,
}

/// What kvol learns of the run before the cases: how the driver is given and what it says it
/// can do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    pub driver_command: bool,
    pub volume_stats: bool,
}

/// Every case kvol runs, in the order it runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CaseId {
    ProvisionDefaults,
    ProvisionMountOptions,
    ProvisionFromSnapshot,
    ProvisionFromClaim,
    Snapshottable,
    VolumesStoreData,
    VolumesExec,
    VolumeIo,
    BlockStoreData,
    VolumeModeBlockAsFilesystem,
    VolumeModeFilesystemAsBlock,
    SubPathNonExistent,
    SubPathExistingDirectory,
    SubPathFile,
    SubPathSymlinkOutside,
    SubPathBackstepping,
    MultiVolumeTwoVolumes,
    MultiVolumeSameVolumeTwoPods,
    MultiVolumeReadOnly,
    FsGroupAlways,
    FsGroupOnRootMismatch,
    ExpandOffline,
    ExpandOnline,
    EphemeralReadWrite,
    EphemeralReadOnly,
    EphemeralTwoPods,
    EphemeralMultiple,
    GenericEphemeralReadWrite,
    VolumeStats,
    DriverRestartBetweenStageAndPublish,
}

/// One row of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Case {
    pub id: CaseId,
    /// kvol's short name for the case (`--focus` matches it; the table's first column).
    pub name: &'static str,
    /// The upstream suite (`test/e2e/storage/testsuites/<suite>.go`'s name).
    pub suite: &'static str,
    /// Upstream's test pattern, without `[Testpattern: ]`.
    pub pattern: &'static str,
    /// Upstream's test name within the suite; for kvol's own cases, what it checks.
    pub test: &'static str,
    /// Whether upstream has this test (false: kvol's own, said as such).
    pub upstream: bool,
    pub needs: &'static [Need],
    /// Whether a container is what upstream runs the check in; kvol checks through the
    /// published path on the host.
    pub host_side: bool,
}

impl Case {
    /// The name upstream's report gives the test (`[Testpattern: …] suite test`), or kvol's.
    pub fn upstream_name(&self) -> String {
        if self.upstream {
            format!("[Testpattern: {}] {} {}", self.pattern, self.suite, self.test)
        } else {
            format!("(kvol) [{}] {} {}", self.pattern, self.suite, self.test)
        }
    }
}

const DYN: &str = "Dynamic PV (default fs)";
const DYN_EXPAND: &str = "Dynamic PV (default fs)(allowExpansion)";
const INLINE: &str = "CSI Ephemeral-volume (default fs)";
const BLOCK: &str = "Dynamic PV (block volmode)";
const SNAPSHOT: &str = "Dynamic Snapshot (delete policy)";
const GENERIC: &str = "Generic Ephemeral-volume (default fs) (late-binding)";
const PERSIST: &[Need] = &[Need::StorageClass, Need::Capability("persistence")];
const CLASS: &[Need] = &[Need::StorageClass];

const fn case(
    id: CaseId,
    name: &'static str,
    suite: &'static str,
    pattern: &'static str,
    test: &'static str,
    needs: &'static [Need],
) -> Case {
    Case { id, name, suite, pattern, test, upstream: true, needs, host_side: true }
}

/// The table.
pub const CASES: [Case; 30] = [
    // Upstream's name for the plain create-use-delete test in the suites of v1.14 to about
    // v1.20; later versions fold it into the other provisioning tests.
    case(
        CaseId::ProvisionDefaults,
        "provision-defaults",
        "provisioning",
        DYN,
        "should provision storage with defaults",
        CLASS,
    ),
    case(
        CaseId::ProvisionMountOptions,
        "provision-mount-options",
        "provisioning",
        DYN,
        "should provision storage with mount options",
        &[Need::StorageClass, Need::MountOptions],
    ),
    case(
        CaseId::ProvisionFromSnapshot,
        "provision-from-snapshot",
        "provisioning",
        DYN,
        "should provision storage with snapshot data source",
        &[Need::StorageClass, Need::SnapshotClass, Need::Capability("snapshotDataSource")],
    ),
    case(
        CaseId::ProvisionFromClaim,
        "provision-from-claim",
        "provisioning",
        DYN,
        "should provision storage with pvc data source",
        &[Need::StorageClass, Need::Capability("pvcDataSource")],
    ),
    case(
        CaseId::Snapshottable,
        "snapshottable",
        "snapshottable",
        SNAPSHOT,
        "volume snapshot controller should check snapshot fields, check restore correctly works after modifying source data, check deletion (persistent)",
        &[Need::StorageClass, Need::SnapshotClass, Need::Capability("snapshotDataSource")],
    ),
    case(CaseId::VolumesStoreData, "volumes-store-data", "volumes", DYN, "should store data", PERSIST),
    case(
        CaseId::VolumesExec,
        "volumes-exec",
        "volumes",
        DYN,
        "should allow exec of files on the volume",
        &[Need::StorageClass, Need::Capability("exec")],
    ),
    case(
        CaseId::VolumeIo,
        "volume-io",
        "volumeIO",
        DYN,
        "should write files of various sizes, verify size, validate content",
        PERSIST,
    ),
    case(
        CaseId::BlockStoreData,
        "block-store-data",
        "volumes",
        BLOCK,
        "should store data",
        &[Need::StorageClass, Need::Capability("persistence"), Need::Capability("block")],
    ),
    case(
        CaseId::VolumeModeBlockAsFilesystem,
        "volumemode-block-as-filesystem",
        "volumeMode",
        BLOCK,
        "should fail to use a volume in a pod with mismatched mode",
        &[Need::StorageClass, Need::Capability("block")],
    ),
    case(
        CaseId::VolumeModeFilesystemAsBlock,
        "volumemode-filesystem-as-block",
        "volumeMode",
        DYN,
        "should fail to use a volume in a pod with mismatched mode",
        CLASS,
    ),
    case(
        CaseId::SubPathNonExistent,
        "subpath-non-existent",
        "subPath",
        DYN,
        "should support non-existent path",
        CLASS,
    ),
    case(
        CaseId::SubPathExistingDirectory,
        "subpath-existing-directory",
        "subPath",
        DYN,
        "should support existing directory",
        CLASS,
    ),
    case(CaseId::SubPathFile, "subpath-file", "subPath", DYN, "should support file as subpath", CLASS),
    case(
        CaseId::SubPathSymlinkOutside,
        "subpath-symlink-outside",
        "subPath",
        DYN,
        "should fail if subpath directory is outside the volume",
        CLASS,
    ),
    case(
        CaseId::SubPathBackstepping,
        "subpath-backstepping",
        "subPath",
        DYN,
        "should fail if subpath with backstepping is outside the volume",
        CLASS,
    ),
    case(
        CaseId::MultiVolumeTwoVolumes,
        "multivolume-two-volumes",
        "multiVolume",
        DYN,
        "should access to two volumes with the same volume mode and retain data across pod recreation on the same node",
        PERSIST,
    ),
    case(
        CaseId::MultiVolumeSameVolumeTwoPods,
        "multivolume-same-volume-two-pods",
        "multiVolume",
        DYN,
        "should concurrently access the single volume from pods on the same node",
        &[Need::StorageClass, Need::Capability("multipods")],
    ),
    case(
        CaseId::MultiVolumeReadOnly,
        "multivolume-read-only",
        "multiVolume",
        DYN,
        "should concurrently access the single read-only volume from pods on the same node",
        &[Need::StorageClass, Need::Capability("multipods")],
    ),
    case(
        CaseId::FsGroupAlways,
        "fsgroup-always",
        "fsgroupchangepolicy",
        DYN,
        "(Always)[LinuxOnly], pod created with an initial fsgroup, new pod fsgroup applied to volume contents",
        &[Need::StorageClass, Need::Capability("fsGroup")],
    ),
    case(
        CaseId::FsGroupOnRootMismatch,
        "fsgroup-on-root-mismatch",
        "fsgroupchangepolicy",
        DYN,
        "(OnRootMismatch)[LinuxOnly], pod created with an initial fsgroup, volume contents ownership changed via chgrp in first pod, new pod with same fsgroup skips ownership changes to the volume contents",
        &[Need::StorageClass, Need::Capability("fsGroup")],
    ),
    case(
        CaseId::ExpandOffline,
        "expand-offline",
        "volume-expand",
        DYN_EXPAND,
        "Verify if offline PVC expansion works",
        &[Need::StorageClass, Need::Capability("controllerExpansion"), Need::Capability("offlineExpansion")],
    ),
    case(
        CaseId::ExpandOnline,
        "expand-online",
        "volume-expand",
        DYN_EXPAND,
        "should resize volume when PVC is edited while pod is using it",
        &[Need::StorageClass, Need::Capability("controllerExpansion"), Need::Capability("onlineExpansion")],
    ),
    case(
        CaseId::EphemeralReadWrite,
        "ephemeral-read-write",
        "ephemeral",
        INLINE,
        "should create read/write inline ephemeral volume",
        &[Need::InlineVolumes],
    ),
    case(
        CaseId::EphemeralReadOnly,
        "ephemeral-read-only",
        "ephemeral",
        INLINE,
        "should create read-only inline ephemeral volume",
        &[Need::InlineVolumes],
    ),
    case(
        CaseId::EphemeralTwoPods,
        "ephemeral-two-pods",
        "ephemeral",
        INLINE,
        "should support two pods which have the same volume definition",
        &[Need::InlineVolumes],
    ),
    case(
        CaseId::EphemeralMultiple,
        "ephemeral-multiple",
        "ephemeral",
        INLINE,
        "should support multiple inline ephemeral volumes",
        &[Need::InlineVolumes],
    ),
    case(
        CaseId::GenericEphemeralReadWrite,
        "generic-ephemeral-read-write",
        "ephemeral",
        GENERIC,
        "should create read/write inline ephemeral volume",
        CLASS,
    ),
    Case {
        upstream: false,
        ..case(
            CaseId::VolumeStats,
            "volume-stats",
            "volumeStats",
            DYN,
            "NodeGetVolumeStats reports what was written to the published volume",
            &[Need::StorageClass, Need::VolumeStats],
        )
    },
    Case {
        upstream: false,
        ..case(
            CaseId::DriverRestartBetweenStageAndPublish,
            "driver-restart-stage-publish",
            "disruptive",
            DYN,
            "data written before the driver is restarted between NodeStageVolume and NodePublishVolume is read after",
            &[Need::StorageClass, Need::Capability("persistence"), Need::DriverCommand],
        )
    },
];

/// Run the case, or skip it and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Run,
    Skip(String),
}

/// Why `need` is not met, in upstream's words where upstream has them; `None` when it is.
pub fn unmet(need: Need, definition: &DriverDefinition, facts: Facts) -> Option<String> {
    let name = &definition.driver_info.name;
    let met = match need {
        Need::StorageClass => definition.storage_class.is_set(),
        Need::SnapshotClass => definition.snapshot_class.is_set(),
        Need::InlineVolumes => !definition.inline_volumes.is_empty(),
        Need::MountOptions => !definition.driver_info.mount_options.is_empty(),
        Need::Capability(capability) => definition.driver_info.has(capability),
        Need::DriverCommand => facts.driver_command,
        Need::VolumeStats => facts.volume_stats,
    };
    if met {
        return None;
    }
    Some(match need {
        Need::StorageClass => format!(
            "driver {name:?} does not support volume type \"DynamicPV\": no StorageClass in the definition"
        ),
        Need::SnapshotClass => {
            format!("driver {name:?} does not support snapshotting: no SnapshotClass in the definition")
        }
        Need::InlineVolumes => format!(
            "driver {name:?} does not support volume type \"CSIInlineVolume\": no InlineVolumes in the definition"
        ),
        Need::MountOptions => format!("driver {name:?} does not define supported mount option"),
        Need::Capability(capability) => format!("driver {name:?} does not have capability {capability}"),
        Need::DriverCommand => "kvol can restart only a driver it starts: give --driver-command".to_string(),
        Need::VolumeStats => {
            format!("driver {name:?} does not offer GET_VOLUME_STATS in NodeGetCapabilities")
        }
    })
}

/// Whether `case` runs for this definition and these facts; the first unmet need is the reason.
pub fn verdict(case: &Case, definition: &DriverDefinition, facts: Facts) -> Verdict {
    match case.needs.iter().find_map(|need| unmet(*need, definition, facts)) {
        Some(reason) => Verdict::Skip(reason),
        None => Verdict::Run,
    }
}

/// The cases asked for and their verdicts: with `focus` given, only those whose name (or
/// upstream name) contains one of its words.
pub fn select(definition: &DriverDefinition, facts: Facts, focus: &[String]) -> Vec<(Case, Verdict)> {
    CASES
        .iter()
        .filter(|case| {
            focus.is_empty()
                || focus
                    .iter()
                    .any(|f| case.name.contains(f.as_str()) || case.upstream_name().contains(f.as_str()))
        })
        .map(|case| (*case, verdict(case, definition, facts)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::parse;

    fn skipped(definition: &str, facts: Facts) -> Vec<(&'static str, String)> {
        let d = parse(definition, "t.yaml").unwrap();
        select(&d, facts, &[])
            .into_iter()
            .filter_map(|(case, v)| match v {
                Verdict::Skip(reason) => Some((case.name, reason)),
                Verdict::Run => None,
            })
            .collect()
    }

    fn runs(definition: &str, facts: Facts) -> Vec<&'static str> {
        let d = parse(definition, "t.yaml").unwrap();
        select(&d, facts, &[]).into_iter().filter(|(_, v)| *v == Verdict::Run).map(|(c, _)| c.name).collect()
    }

    #[test]
    fn names_are_unique_and_the_table_is_in_id_order() {
        let mut names: Vec<_> = CASES.iter().map(|c| c.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), CASES.len());
        assert!(CASES.windows(2).all(|w| w[0].id < w[1].id));
    }

    #[test]
    fn what_runs_follows_the_definition_and_the_facts() {
        let all = Facts { driver_command: true, volume_stats: true };
        // (definition, facts, cases that must run, cases that must not)
        let table: [(&str, Facts, &[&str], &[&str]); 6] = [
            (
                "DriverInfo: {Name: d}",
                all,
                &[],
                &["provision-defaults", "ephemeral-read-write", "volume-stats"],
            ),
            (
                "DriverInfo: {Name: d}\nStorageClass: {FromName: true}",
                all,
                &["provision-defaults", "subpath-file", "volume-stats"],
                &["volumes-store-data", "provision-from-snapshot"],
            ),
            (
                "DriverInfo: {Name: d, Capabilities: {persistence: true}}\nStorageClass: {FromName: true}",
                Facts::default(),
                &["volumes-store-data", "volume-io", "multivolume-two-volumes"],
                &["driver-restart-stage-publish", "volume-stats"],
            ),
            (
                "DriverInfo: {Name: d, Capabilities: {persistence: true}}\nStorageClass: {FromName: true}",
                all,
                &["driver-restart-stage-publish"],
                &["expand-online", "multivolume-read-only"],
            ),
            (
                "DriverInfo: {Name: d, Capabilities: {controllerExpansion: true, onlineExpansion: false}}\nStorageClass: {FromName: true}",
                all,
                &["expand-offline"],
                &["expand-online"],
            ),
            (
                "DriverInfo: {Name: d}\nInlineVolumes: [{}]",
                all,
                &["ephemeral-read-write", "ephemeral-two-pods"],
                &["provision-defaults"],
            ),
        ];
        for (definition, facts, run, not) in table {
            let running = runs(definition, facts);
            for name in run {
                assert!(running.contains(name), "{definition}: {name} should run, runs {running:?}");
            }
            for name in not {
                assert!(!running.contains(name), "{definition}: {name} should not run");
            }
        }
    }

    #[test]
    fn skip_reasons_name_what_is_missing() {
        let skips = skipped("DriverInfo: {Name: d}\nStorageClass: {FromName: true}", Facts::default());
        let reason = |name: &str| skips.iter().find(|(n, _)| *n == name).map(|(_, r)| r.clone()).unwrap();
        assert_eq!(
            reason("provision-from-snapshot"),
            "driver \"d\" does not support snapshotting: no SnapshotClass in the definition"
        );
        assert_eq!(reason("volumes-store-data"), "driver \"d\" does not have capability persistence");
        assert_eq!(
            reason("driver-restart-stage-publish"),
            "driver \"d\" does not have capability persistence"
        );
        assert_eq!(
            reason("volume-stats"),
            "driver \"d\" does not offer GET_VOLUME_STATS in NodeGetCapabilities"
        );
        assert_eq!(reason("provision-mount-options"), "driver \"d\" does not define supported mount option");
        assert_eq!(
            reason("ephemeral-read-only"),
            "driver \"d\" does not support volume type \"CSIInlineVolume\": no InlineVolumes in the definition"
        );
    }

    #[test]
    fn focus_keeps_the_matching_cases_only() {
        let d = parse("DriverInfo: {Name: d}\nStorageClass: {FromName: true}", "t.yaml").unwrap();
        let chosen = select(&d, Facts::default(), &["subpath".to_string()]);
        let names: Vec<_> = chosen.iter().map(|(c, _)| c.name).collect();
        assert_eq!(
            names,
            [
                "subpath-non-existent",
                "subpath-existing-directory",
                "subpath-file",
                "subpath-symlink-outside",
                "subpath-backstepping"
            ]
        );
        assert!(chosen.iter().all(|(_, v)| *v == Verdict::Run));
        let focus = ["subpath-file".to_string(), "should provision storage with defaults".to_string()];
        let names: Vec<_> = select(&d, Facts::default(), &focus).iter().map(|(c, _)| c.name).collect();
        assert_eq!(names, ["provision-defaults", "subpath-file"]);
    }

    #[test]
    fn upstream_names_read_as_upstreams_report() {
        let case = CASES.iter().find(|c| c.id == CaseId::VolumesStoreData).unwrap();
        assert_eq!(case.upstream_name(), "[Testpattern: Dynamic PV (default fs)] volumes should store data");
        let own = CASES.iter().find(|c| c.id == CaseId::VolumeStats).unwrap();
        assert!(own.upstream_name().starts_with("(kvol) "));
    }
}
