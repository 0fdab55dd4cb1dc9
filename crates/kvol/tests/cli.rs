//! End-to-end tests of the real `kvol` binary: files, stdin, formats, exit codes, messages.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn kvol(args: &[&str], stdin: Option<&str>) -> Output {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvol"))
        .args(args)
        .current_dir(root)
        .env_remove("KVOL_CONFIG")
        .env_remove("KVOL_FEATURE_GATES")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the kvol binary runs");
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(pipe);
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[cfg_attr(not(feature = "all-plugins"), allow(dead_code))]
fn json_stream(out: &[u8]) -> Vec<serde_json::Value> {
    serde_json::Deserializer::from_slice(out)
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("stdout is a JSON stream")
}

const NFS_PV: &str =
    "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: nfs}\nspec: {nfs: {server: s, path: /x}}\n";

#[test]
fn a_malformed_stream_fails_with_nothing_on_stdout() {
    let out = kvol(&["translate"], Some("apiVersion: v1\nkind: [PersistentVolume\n"));
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(
        text(&out.stderr).contains("cannot parse standard input as YAML or JSON"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn an_untranslatable_document_names_its_position_and_kind() {
    let out = kvol(&["translate", "-"], Some(NFS_PV));
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert!(
        err.contains("document 1 (PersistentVolume/nfs): persistent volume \"nfs\" has no in-tree source"),
        "{err}"
    );
    assert!(err.contains("1 document(s) could not be translated; nothing was written"), "{err}");
}

#[test]
fn invalid_gates_stop_every_command_with_exit_2() {
    for args in [
        &["--feature-gates", "CSIMigrationFoo=true", "gates"][..],
        &["--feature-gates", "CSIMigrationAWS=false", "translate", "examples/in-tree"][..],
        &["--feature-gates", "InTreePluginRBDUnregister=true", "gates"][..],
    ] {
        let out = kvol(args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(text(&out.stderr).starts_with("kvol: invalid feature gates: "), "{}", text(&out.stderr));
    }
}

#[test]
fn a_bad_config_file_is_named() {
    let dir = std::env::temp_dir().join(format!("kvol-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("kvol.yaml");
    std::fs::write(&cfg, "featureGatess: {}\n").unwrap();
    let out = kvol(&["--config", cfg.to_str().unwrap(), "gates"], None);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("invalid config file {}", cfg.display())), "{err}");
    std::fs::write(&cfg, "featureGates: {CSIMigrationRBD: true}\n").unwrap();
    let out = kvol(&["--config", cfg.to_str().unwrap(), "gates", "-o", "json"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rbd =
        report["plugins"].as_array().unwrap().iter().find(|p| p["plugin"] == "kubernetes.io/rbd").unwrap();
    assert_eq!(rbd["migrated"], true);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[cfg(feature = "all-plugins")]
mod with_plugins {
    use super::*;

    #[test]
    fn the_readme_command_translates_every_example() {
        let out = kvol(&["translate", "examples/in-tree", "-o", "json"], None);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let docs = json_stream(&out.stdout);
        // 8 PVs + 2 PVs from the pod's inline volumes (its emptyDir is left alone) + 4 StorageClasses,
        // in file-name order: persistentvolumes, pod-inline, storageclasses.
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, [vec!["PersistentVolume"; 10], vec!["StorageClass"; 4]].concat());
        let drivers: Vec<&str> =
            docs[..10].iter().map(|d| d["spec"]["csi"]["driver"].as_str().unwrap()).collect();
        assert_eq!(
            drivers,
            [
                "ebs.csi.aws.com",
                "pd.csi.storage.gke.io",
                "disk.csi.azure.com",
                "file.csi.azure.com",
                "cinder.csi.openstack.org",
                "csi.vsphere.vmware.com",
                "pxd.portworx.com",
                "rbd.csi.ceph.com",
                "pd.csi.storage.gke.io",
                "file.csi.azure.com",
            ]
        );
        // The pod's namespace reaches the Azure File handle.
        assert_eq!(docs[9]["spec"]["csi"]["volumeHandle"], "#media#media#media#shop");
        // In-tree sources are gone.
        assert!(
            docs[..10].iter().all(|d| d["spec"]
                .as_object()
                .unwrap()
                .keys()
                .all(|k| k != "awsElasticBlockStore"))
        );
    }

    #[test]
    fn yaml_and_json_carry_the_same_objects_in_the_same_order() {
        let yaml = kvol(&["translate", "examples/in-tree/persistentvolumes.yaml"], None);
        let json = kvol(&["translate", "-o", "json", "examples/in-tree/persistentvolumes.yaml"], None);
        assert!(yaml.status.success() && json.status.success());
        let from_yaml: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text(&yaml.stdout)).unwrap();
        assert_eq!(from_yaml, json_stream(&json.stdout));
    }

    #[test]
    fn stdin_and_to_in_tree_round_trip() {
        let csi = std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/csi/persistentvolumes.yaml"),
        )
        .unwrap();
        let out = kvol(&["translate", "--to-in-tree", "-o", "json"], Some(&csi));
        assert!(out.status.success(), "{}", text(&out.stderr));
        let docs = json_stream(&out.stdout);
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0]["spec"]["awsElasticBlockStore"]["volumeID"], "vol-0123456789abcdef0");
        assert_eq!(docs[0]["metadata"]["labels"]["topology.kubernetes.io/region"], "us-west-2");
        assert_eq!(docs[1]["spec"]["gcePersistentDisk"]["pdName"], "pd-1");
        assert!(docs.iter().all(|d| d["spec"].get("csi").is_none()));
    }

    #[test]
    fn one_bad_document_among_good_ones_writes_nothing() {
        let good = std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/in-tree/persistentvolumes.yaml"),
        )
        .unwrap();
        let input = format!("{good}---\n{NFS_PV}");
        let out = kvol(&["translate"], Some(&input));
        assert_eq!(out.status.code(), Some(1));
        assert!(out.stdout.is_empty());
        assert!(text(&out.stderr).contains("document 9 (PersistentVolume/nfs)"), "{}", text(&out.stderr));
    }

    #[test]
    fn plugins_lists_local_plugins_and_in_tree_migration_state() {
        let out = kvol(&["plugins", "--node-name", "n1"], None);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let table = text(&out.stdout);
        let line = |name: &str| {
            table
                .lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("{name} in\n{table}"))
                .to_string()
        };
        assert!(table.starts_with("NAME "), "{table}");
        assert!(line("kubernetes.io/empty-dir ").contains("compiled-in"), "{table}");
        assert!(line("kubernetes.io/aws-ebs ").contains("on → ebs.csi.aws.com (CSIMigrationAWS)"), "{table}");
        assert!(line("kubernetes.io/rbd ").contains("off → rbd.csi.ceph.com (CSIMigrationRBD)"), "{table}");

        let args = [
            "--feature-gates",
            "CSIMigrationRBD=true,InTreePluginRBDUnregister=true",
            "plugins",
            "-o",
            "json",
        ];
        let out = kvol(&args, None);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        let rbd = rows.iter().find(|r| r["name"] == "kubernetes.io/rbd").unwrap();
        assert_eq!(rbd["registered"], false);
        assert_eq!(rbd["migration"]["state"], "complete");
        assert_eq!(rbd["note"], "InTreePluginRBDUnregister is on");
        let host_path = rows.iter().find(|r| r["name"] == "kubernetes.io/host-path").unwrap();
        assert_eq!(host_path["kind"], "compiled-in");
        assert_eq!(host_path["registered"], true);
    }
}

#[cfg(not(feature = "all-plugins"))]
#[test]
fn a_build_without_plugins_says_which_feature_is_missing() {
    let out = kvol(&["translate", "examples/in-tree/persistentvolumes.yaml"], None);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("document 1 (PersistentVolume/ebs-data): kubernetes.io/aws-ebs translation is not compiled into this build (cargo feature \"aws-ebs\" of kvol-translate)"),
        "{err}"
    );
    // Phase 3: without their translation, in-tree plugins are not registered at all.
    let out = kvol(&["plugins", "-o", "json"], None);
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let ebs = rows.iter().find(|r| r["name"] == "kubernetes.io/aws-ebs").unwrap();
    assert_eq!(ebs["registered"], false);
    assert!(ebs["note"].as_str().unwrap().contains("not compiled into this build"), "{ebs}");
}

#[test]
fn flex_install_is_atomic_idempotent_and_plugins_shows_drivers_or_their_load_error() {
    let dir = tempfile_dir("flex");
    let dir_arg = dir.to_str().unwrap();
    let install =
        |name: &str, file: &str| kvol(&["flex", "install", file, "--name", name, "--dir", dir_arg], None);

    let out = install("kvol~tmpfs", "examples/flexvolume/kvol~tmpfs/tmpfs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("installed: flexvolume driver kvol/tmpfs at "),
        "{}",
        text(&out.stdout)
    );
    let out = install("kvol~tmpfs", "examples/flexvolume/kvol~tmpfs/tmpfs");
    assert!(text(&out.stdout).starts_with("unchanged: "), "{}", text(&out.stdout));
    // A failed install names the path, exits 1 and leaves the installed version alone.
    let out = install("kvol~tmpfs", "examples/flexvolume/no-such-driver");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("examples/flexvolume/no-such-driver"), "{}", text(&out.stderr));
    let installed = std::fs::read(dir.join("kvol~tmpfs/tmpfs")).unwrap();
    assert_eq!(installed, std::fs::read("../../examples/flexvolume/kvol~tmpfs/tmpfs").unwrap());
    let out = install("kvol~bad:name", "examples/flexvolume/kvol~tmpfs/tmpfs");
    assert_eq!(out.status.code(), Some(1), "an invalid name is refused");

    // A driver whose init prints garbage is listed with its load error.
    std::fs::create_dir(dir.join("bad~drv")).unwrap();
    let garbage = dir.join("bad~drv/drv");
    std::fs::write(&garbage, "#!/bin/sh\necho garbage\n").unwrap();
    std::fs::set_permissions(&garbage, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let out = kvol(&["plugins", "-o", "json", "--flex-dir", dir_arg], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let tmpfs = rows.iter().find(|r| r["name"] == "kvol/tmpfs").expect("the installed driver is listed");
    assert_eq!(tmpfs["kind"], "flexvolume");
    assert_eq!(tmpfs["registered"], true);
    assert_eq!(tmpfs["source"], "flexvolume");
    assert!(tmpfs["capabilities"].as_array().unwrap().contains(&"publish".into()), "{tmpfs}");
    assert!(
        !tmpfs["capabilities"].as_array().unwrap().contains(&"attach".into()),
        "tmpfs is mount-only: {tmpfs}"
    );
    assert!(tmpfs["details"]["init"].as_str().unwrap().starts_with("attach=false "), "{tmpfs}");
    let bad = rows.iter().find(|r| r["name"] == "bad/drv").expect("the broken driver is listed");
    assert_eq!(bad["registered"], false);
    assert!(
        bad["note"].as_str().unwrap().contains("init printed output that is not a driver status"),
        "{bad}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempfile_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvol-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn components_list_shows_user_definitions_and_plan_checks_the_storage_section() {
    let dir = tempfile_dir("components");
    let defs = dir.join("components");
    std::fs::create_dir_all(&defs).unwrap();
    std::fs::write(defs.join("nfs.yaml"), "name: nfs\nrole: driver\nprovides: {csiDriver: nfs.csi.k8s.io}\n")
        .unwrap();
    std::fs::write(defs.join("bad.yaml"), "name: Bad\nrole: optional\n").unwrap();
    let defs_arg = defs.to_str().unwrap();
    let out = kvol(&["components", "list", "--definitions-dir", defs_arg, "-o", "json"], None);
    assert_eq!(out.status.code(), Some(1), "a definition was left out");
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = listed.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["hostpath", "lvm", "nfs", "snapshot-controller"]);
    assert_eq!(listed[2]["source"], defs.join("nfs.yaml").to_str().unwrap());
    let bundles: Vec<u64> = listed.iter().map(|c| c["cluster_objects"].as_u64().unwrap()).collect();
    assert!(bundles[0] > 0 && bundles[1] > 0, "the built-in drivers have cluster bundles: {bundles:?}");
    assert_eq!(bundles[2..], [0, 0], "nfs and snapshot-controller have none");
    let err = text(&out.stderr);
    assert!(err.contains("bad.yaml: component \"Bad\": name: \"Bad\" is not a DNS-1123 label"), "{err}");

    let cfg = dir.join("kvol.yaml");
    let plan = |config: &str| {
        std::fs::write(&cfg, config).unwrap();
        let args = ["--config", cfg.to_str().unwrap(), "components", "plan", "--definitions-dir", defs_arg];
        kvol(&[&args[..], &["--volume-group", "true"]].concat(), None)
    };
    let out = plan("storage:\n  driver: none\n  optionalCsiComponents: [none, snapshot-controler]\n");
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    for words in [
        "kvol: invalid config: storage.optionalCsiComponents: none stands alone, but the list also has snapshot-controler",
        "kvol: invalid config: storage.optionalCsiComponents: unknown component \"snapshot-controler\"",
    ] {
        assert!(err.contains(words), "{err}");
    }
    let out = plan("storage:\n  optionalCsiComponents: [\"\"]\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout)
            .lines()
            .map(|l| l.split(": ").take(2).collect::<Vec<_>>().join(": "))
            .collect::<Vec<_>>(),
        ["hostpath: off", "lvm: run", "nfs: off", "snapshot-controller: run"]
    );
    assert!(text(&out.stderr).contains("write [none] to run none"), "{}", text(&out.stderr));
    std::fs::remove_dir_all(&dir).unwrap();
}
