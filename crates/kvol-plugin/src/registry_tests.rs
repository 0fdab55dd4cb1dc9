//! Tests of the registry: every lookup by spec and by name, dynamic changes, snapshots and concurrent readers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, EmptyDirVolumeSource, HostPathVolumeSource, PersistentVolume,
    PersistentVolumeSpec, SecretVolumeSource, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvol_api::MigratablePlugin::{self, *};
use serde_json::json;

use super::*;
use crate::intree::InTreeDescriptor;
use crate::testing::*;
use DynamicSource::{Csi, Flexvolume};

const EMPTY_DIR: &str = "kubernetes.io/empty-dir";
const HOST_PATH: &str = "kubernetes.io/host-path";
/// Persistent, offers every part.
const CSI_FULL: &str = "full.csi.example.com";
/// Offers attach and stage but says no to both per spec (no ControllerPublish, no Stage);
/// offers node expansion but not controller expansion.
const CSI_NOATTACH: &str = "noattach.csi.example.com";
/// Publish only; supports only volumes named `keep-…`.
const CSI_PICKY: &str = "picky.csi.example.com";
/// Attach, stage, publish, controller expansion; persistent.
const FLEX_ATTACH: &str = "vendor/attach";
/// Publish only, not persistent.
const FLEX_PLAIN: &str = "vendor/plain";

fn in_tree_descriptors() -> Vec<PluginRef> {
    MigratablePlugin::ALL.into_iter().map(|p| Arc::new(InTreeDescriptor::new(p)) as PluginRef).collect()
}

fn add(plugin: FakePluginBuilder) -> ProbeEvent {
    ProbeEvent::AddOrUpdate(plugin.build_ref())
}

fn remove(name: &str) -> ProbeEvent {
    ProbeEvent::Remove(name.to_string())
}

/// The registry most lookup tables run against.
fn standard() -> PluginRegistry {
    let mut compiled = vec![
        FakePlugin::field(EMPTY_DIR, "emptyDir").build_ref(),
        FakePlugin::field(HOST_PATH, "hostPath").persistent(true).offers([Part::Delete]).build_ref(),
        // Two plugins share the nfs source; can_support tells them apart.
        FakePlugin::field("z/nfs-a", "nfs").persistent(true).supports_names_starting_with("a-").build_ref(),
        FakePlugin::field("y/nfs-b", "nfs").persistent(true).supports_names_starting_with("b-").build_ref(),
        // Three serve configMap: two support everything (registered out of name order), one nothing.
        FakePlugin::field("z/config", "configMap").build_ref(),
        FakePlugin::field("a/config", "configMap").build_ref(),
        FakePlugin::field("m/config", "configMap").supports_if(|_| false).build_ref(),
    ];
    compiled.extend(in_tree_descriptors());
    let registry = PluginRegistry::new(compiled).expect("unique names");
    let csi = [
        add(FakePlugin::csi(CSI_FULL).offers_all()),
        add(FakePlugin::csi(CSI_NOATTACH)
            .offers([Part::Attach, Part::Stage, Part::NodeExpand])
            .can_attach(false)
            .can_device_mount(false)),
        add(FakePlugin::csi(CSI_PICKY).supports_names_starting_with("keep-")),
    ];
    assert!(registry.apply(Csi, csi).is_empty());
    let flex = [
        add(FakePlugin::flex(FLEX_ATTACH).offers([Part::Attach, Part::Stage, Part::Expand])),
        add(FakePlugin::flex(FLEX_PLAIN).persistent(false)),
    ];
    assert!(registry.apply(Flexvolume, flex).is_empty());
    registry
}

fn empty() -> PluginRegistry {
    PluginRegistry::new(Vec::new()).expect("nothing to clash")
}

fn name_of(found: Result<&PluginRef>) -> Result<&str, String> {
    found.map(|p| p.name()).map_err(|e| e.to_string())
}

fn inline_with(name: &str, f: impl FnOnce(&mut Volume)) -> VolumeSpec {
    let mut vol = volume(name);
    f(&mut vol);
    inline(vol)
}

fn no_match(spec: &str, key: &str) -> String {
    format!("no volume plugin matched {spec} ({key})")
}

fn no_name(name: &str) -> String {
    format!("no volume plugin matched name {name:?}")
}

fn no_code(p: MigratablePlugin) -> String {
    format!(
        "in-tree plugin {} has no code in kvol: its volumes run through CSI driver {} when feature gate CSIMigration{} is on",
        p.in_tree_name(),
        p.csi_driver(),
        p.gate_suffix()
    )
}

fn cannot(plugin: &str, what: &str) -> String {
    format!("volume plugin {plugin} cannot {what}")
}

#[test]
fn find_by_spec_table() {
    type Case = (&'static str, fn() -> PluginRegistry, VolumeSpec, Result<&'static str, String>);
    let cases: Vec<Case> = vec![
        ("inline emptyDir", standard, inline_empty_dir("v"), Ok(EMPTY_DIR)),
        ("hostPath PV", standard, host_path_pv("hp", "/srv"), Ok(HOST_PATH)),
        ("inline hostPath", standard, inline_host_path("v", "/srv"), Ok(HOST_PATH)),
        ("CSI PV", standard, csi_pv("p", CSI_FULL), Ok(CSI_FULL)),
        ("inline CSI", standard, inline_csi("v", CSI_FULL), Ok(CSI_FULL)),
        ("Flex PV", standard, flex_pv("p", FLEX_ATTACH), Ok(FLEX_ATTACH)),
        ("inline Flex", standard, inline_flex("v", FLEX_PLAIN), Ok(FLEX_PLAIN)),
        ("in-tree PV", standard, in_tree_pv("p", AwsEbs), Ok("kubernetes.io/aws-ebs")),
        ("in-tree inline", standard, inline_in_tree("v", AzureFile), Ok("kubernetes.io/azure-file")),
        ("can_support picks a", standard, nfs_pv("a-1", "s", "/"), Ok("z/nfs-a")),
        ("can_support picks b", standard, nfs_pv("b-1", "s", "/"), Ok("y/nfs-b")),
        ("CSI can_support yes", standard, csi_pv("keep-1", CSI_PICKY), Ok(CSI_PICKY)),
        (
            "field: candidates all refuse",
            standard,
            nfs_pv("c-1", "s", "/"),
            Err(no_match("persistent volume \"c-1\"", "source nfs")),
        ),
        (
            "CSI: the one candidate refuses",
            standard,
            csi_pv("drop-1", CSI_PICKY),
            Err(no_match("persistent volume \"drop-1\"", "CSI driver \"picky.csi.example.com\"")),
        ),
        (
            "field nobody serves",
            standard,
            inline_with("s", |v| v.secret = Some(SecretVolumeSource::default())),
            Err(no_match("inline volume \"s\"", "source secret")),
        ),
        ("unknown CSI driver", standard, csi_pv("x", "d"), Err(no_match("persistent volume \"x\"", "CSI driver \"d\""))),
        (
            "CSI driver names are case-sensitive",
            standard,
            csi_pv("x", "FULL.csi.example.com"),
            Err(no_match("persistent volume \"x\"", "CSI driver \"FULL.csi.example.com\"")),
        ),
        (
            "a CSI spec does not match a Flexvolume driver of that name",
            standard,
            csi_pv("x", FLEX_ATTACH),
            Err(no_match("persistent volume \"x\"", "CSI driver \"vendor/attach\"")),
        ),
        (
            "a Flexvolume spec does not match a CSI driver of that name",
            standard,
            inline_flex("v", CSI_FULL),
            Err(no_match("inline volume \"v\"", "Flexvolume driver \"full.csi.example.com\"")),
        ),
        (
            "unknown Flexvolume driver",
            standard,
            flex_pv("x", "vendor/none"),
            Err(no_match("persistent volume \"x\"", "Flexvolume driver \"vendor/none\"")),
        ),
        (
            "in-tree spec without descriptors",
            empty,
            in_tree_pv("p", AwsEbs),
            Err(no_match("persistent volume \"p\"", "source awsElasticBlockStore")),
        ),
        ("empty registry", empty, inline_empty_dir("v"), Err(no_match("inline volume \"v\"", "source emptyDir"))),
        (
            "two match, names sorted, the refusing candidate left out",
            standard,
            inline_with("v", |v| v.config_map = Some(ConfigMapVolumeSource::default())),
            Err("multiple volume plugins matched inline volume \"v\": a/config, z/config".into()),
        ),
        (
            "PV without source",
            standard,
            pv("bare", PersistentVolumeSpec::default()),
            Err("persistent volume \"bare\" sets no volume source".into()),
        ),
        (
            "PV without spec",
            standard,
            VolumeSpec::persistent(PersistentVolume {
                metadata: ObjectMeta { name: Some("nospec".into()), ..ObjectMeta::default() },
                ..PersistentVolume::default()
            }),
            Err("persistent volume \"nospec\" sets no volume source".into()),
        ),
        (
            "inline without source",
            standard,
            inline(volume("bare")),
            Err("inline volume \"bare\" sets no volume source".into()),
        ),
        (
            "PV with two sources",
            standard,
            pv_from_json(json!({"metadata": {"name": "two"}, "spec": {
                "csi": {"driver": CSI_FULL, "volumeHandle": "h"}, "nfs": {"server": "s", "path": "/"}}})),
            Err("persistent volume \"two\" has more than one volume source (csi, nfs); exactly one is allowed".into()),
        ),
        (
            "inline with two sources",
            standard,
            inline_with("v", |v| {
                v.empty_dir = Some(EmptyDirVolumeSource::default());
                v.host_path = Some(HostPathVolumeSource { path: "/srv".into(), ..Default::default() });
            }),
            Err("inline volume \"v\" has more than one volume source (emptyDir, hostPath); exactly one is allowed"
                .into()),
        ),
    ];
    for (case, registry, spec, want) in cases {
        let snap = registry().snapshot();
        assert_eq!(name_of(snap.find_by_spec(&spec)), want, "{case}");
    }
}

#[test]
fn find_by_name_table() {
    let snap = standard().snapshot();
    let cases: &[(&str, Result<&str, String>)] = &[
        (EMPTY_DIR, Ok(EMPTY_DIR)),
        ("kubernetes.io/rbd", Ok("kubernetes.io/rbd")),
        (CSI_FULL, Ok(CSI_FULL)),
        (FLEX_PLAIN, Ok(FLEX_PLAIN)),
        // Found by name even though it supports no spec.
        ("m/config", Ok("m/config")),
        ("nope", Err(no_name("nope"))),
        ("", Err(no_name(""))),
        ("Kubernetes.io/empty-dir", Err(no_name("Kubernetes.io/empty-dir"))),
        // A source field or a prefix is not a name.
        ("emptyDir", Err(no_name("emptyDir"))),
        ("vendor", Err(no_name("vendor"))),
        ("vendor/attach ", Err(no_name("vendor/attach "))),
    ];
    for (name, want) in cases {
        assert_eq!(name_of(snap.find_by_name(name)), want.clone(), "{name:?}");
    }
}

/// The typed lookups, so one table runner covers them all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Typed {
    Persistent,
    Attachable,
    DeviceMountable,
    Expandable,
    NodeExpandable,
    Provisionable,
    Deletable,
}

impl Typed {
    const ALL: [Typed; 7] = [
        Typed::Persistent,
        Typed::Attachable,
        Typed::DeviceMountable,
        Typed::Expandable,
        Typed::NodeExpandable,
        Typed::Provisionable,
        Typed::Deletable,
    ];
}

#[derive(Debug)]
enum Key {
    Spec(VolumeSpec),
    Name(&'static str),
}

/// Runs a typed lookup: `Ok(Some(name))` found, `Ok(None)` the Option lookups' "not this one".
fn typed(snap: &Snapshot, t: Typed, key: &Key) -> Result<Option<String>, String> {
    let found: Result<Option<&PluginRef>> = match (t, key) {
        (Typed::Persistent, Key::Spec(s)) => snap.find_persistent_by_spec(s).map(Some),
        (Typed::Persistent, Key::Name(n)) => snap.find_persistent_by_name(n).map(Some),
        (Typed::Attachable, Key::Spec(s)) => snap.find_attachable_by_spec(s),
        (Typed::Attachable, Key::Name(n)) => snap.find_attachable_by_name(n),
        (Typed::DeviceMountable, Key::Spec(s)) => snap.find_device_mountable_by_spec(s),
        (Typed::DeviceMountable, Key::Name(n)) => snap.find_device_mountable_by_name(n),
        (Typed::Expandable, Key::Spec(s)) => snap.find_expandable_by_spec(s),
        (Typed::Expandable, Key::Name(n)) => snap.find_expandable_by_name(n),
        (Typed::NodeExpandable, Key::Spec(s)) => snap.find_node_expandable_by_spec(s),
        (Typed::NodeExpandable, Key::Name(n)) => snap.find_node_expandable_by_name(n),
        (Typed::Provisionable, Key::Name(n)) => snap.find_provisionable_by_name(n).map(Some),
        (Typed::Provisionable, Key::Spec(_)) => panic!("there is no find_provisionable_by_spec"),
        (Typed::Deletable, Key::Spec(s)) => snap.find_deletable_by_spec(s).map(Some),
        (Typed::Deletable, Key::Name(n)) => snap.find_deletable_by_name(n).map(Some),
    };
    found.map(|p| p.map(|p| p.name().to_string())).map_err(|e| e.to_string())
}

type TypedCase = (Key, Result<Option<&'static str>, String>);

fn run_typed(t: Typed, cases: Vec<TypedCase>) {
    let snap = standard().snapshot();
    let (mut by_spec, mut by_name) = (0, 0);
    for (key, want) in cases {
        match key {
            Key::Spec(_) => by_spec += 1,
            Key::Name(_) => by_name += 1,
        }
        let want = want.map(|o| o.map(str::to_string));
        assert_eq!(typed(&snap, t, &key), want, "{t:?} {key:?}");
    }
    assert!(by_name > 0, "{t:?}: the table must look up by name");
    assert!(by_spec > 0 || t == Typed::Provisionable, "{t:?}: the table must look up by spec");
}

/// Rows every typed lookup shares: unmatched, ambiguous and sourceless specs, unknown names.
fn shared_errors() -> Vec<TypedCase> {
    vec![
        (Key::Spec(csi_pv("x", "d")), Err(no_match("persistent volume \"x\"", "CSI driver \"d\""))),
        (
            Key::Spec(flex_pv("x", "v/d")),
            Err(no_match("persistent volume \"x\"", "Flexvolume driver \"v/d\"")),
        ),
        (
            Key::Spec(inline_with("v", |v| v.config_map = Some(ConfigMapVolumeSource::default()))),
            Err("multiple volume plugins matched inline volume \"v\": a/config, z/config".into()),
        ),
        (Key::Spec(inline(volume("bare"))), Err("inline volume \"bare\" sets no volume source".into())),
        (Key::Name("nope"), Err(no_name("nope"))),
    ]
}

#[test]
fn find_persistent_table() {
    let mut cases = vec![
        (Key::Spec(csi_pv("p", CSI_FULL)), Ok(Some(CSI_FULL))),
        (Key::Spec(host_path_pv("p", "/srv")), Ok(Some(HOST_PATH))),
        (Key::Spec(inline_empty_dir("v")), Err(cannot(EMPTY_DIR, "serve persistent volumes"))),
        (Key::Spec(inline_flex("v", FLEX_PLAIN)), Err(cannot(FLEX_PLAIN, "serve persistent volumes"))),
        // A question, not an operation: in-tree descriptors answer it (their access modes matter).
        (Key::Spec(in_tree_pv("p", GcePd)), Ok(Some("kubernetes.io/gce-pd"))),
        (Key::Name(HOST_PATH), Ok(Some(HOST_PATH))),
        (Key::Name("kubernetes.io/rbd"), Ok(Some("kubernetes.io/rbd"))),
        (Key::Name(EMPTY_DIR), Err(cannot(EMPTY_DIR, "serve persistent volumes"))),
        (Key::Name("a/config"), Err(cannot("a/config", "serve persistent volumes"))),
    ];
    cases.extend(shared_errors());
    run_typed(Typed::Persistent, cases);
}

#[test]
fn find_attachable_table() {
    let mut cases = vec![
        (Key::Spec(csi_pv("p", CSI_FULL)), Ok(Some(CSI_FULL))),
        (Key::Name(CSI_FULL), Ok(Some(CSI_FULL))),
        // can_attach false for the spec: found, but nothing to attach.
        (Key::Spec(csi_pv("p", CSI_NOATTACH)), Ok(None)),
        // By name the question is whether the plugin can attach at all.
        (Key::Name(CSI_NOATTACH), Ok(Some(CSI_NOATTACH))),
        (Key::Spec(flex_pv("p", FLEX_ATTACH)), Ok(Some(FLEX_ATTACH))),
        (Key::Name(FLEX_ATTACH), Ok(Some(FLEX_ATTACH))),
        (Key::Spec(inline_flex("v", FLEX_PLAIN)), Ok(None)),
        (Key::Name(FLEX_PLAIN), Ok(None)),
        (Key::Spec(inline_empty_dir("v")), Ok(None)),
        (Key::Name(EMPTY_DIR), Ok(None)),
        (Key::Spec(in_tree_pv("p", AwsEbs)), Err(no_code(AwsEbs))),
        (Key::Spec(inline_in_tree("v", Cinder)), Err(no_code(Cinder))),
        (Key::Name("kubernetes.io/aws-ebs"), Err(no_code(AwsEbs))),
    ];
    cases.extend(shared_errors());
    run_typed(Typed::Attachable, cases);
}

#[test]
fn find_device_mountable_table() {
    let mut cases = vec![
        (Key::Spec(csi_pv("p", CSI_FULL)), Ok(Some(CSI_FULL))),
        (Key::Name(CSI_FULL), Ok(Some(CSI_FULL))),
        (Key::Spec(csi_pv("p", CSI_NOATTACH)), Ok(None)),
        (Key::Name(CSI_NOATTACH), Ok(Some(CSI_NOATTACH))),
        (Key::Spec(flex_pv("p", FLEX_ATTACH)), Ok(Some(FLEX_ATTACH))),
        (Key::Spec(csi_pv("keep-1", CSI_PICKY)), Ok(None)),
        (Key::Name(CSI_PICKY), Ok(None)),
        (Key::Spec(host_path_pv("p", "/srv")), Ok(None)),
        (Key::Spec(in_tree_pv("p", Cinder)), Err(no_code(Cinder))),
        (Key::Name("kubernetes.io/azure-disk"), Err(no_code(AzureDisk))),
    ];
    cases.extend(shared_errors());
    run_typed(Typed::DeviceMountable, cases);
}

#[test]
fn find_expandable_table() {
    let mut cases = vec![
        (Key::Spec(csi_pv("p", CSI_FULL)), Ok(Some(CSI_FULL))),
        (Key::Name(CSI_FULL), Ok(Some(CSI_FULL))),
        (Key::Spec(flex_pv("p", FLEX_ATTACH)), Ok(Some(FLEX_ATTACH))),
        (Key::Name(FLEX_ATTACH), Ok(Some(FLEX_ATTACH))),
        // Node expansion only.
        (Key::Spec(csi_pv("p", CSI_NOATTACH)), Ok(None)),
        (Key::Name(CSI_NOATTACH), Ok(None)),
        (Key::Spec(csi_pv("keep-1", CSI_PICKY)), Ok(None)),
        (
            Key::Spec(csi_pv("drop-1", CSI_PICKY)),
            Err(no_match("persistent volume \"drop-1\"", "CSI driver \"picky.csi.example.com\"")),
        ),
        (Key::Spec(in_tree_pv("p", Vsphere)), Err(no_code(Vsphere))),
        (Key::Name("kubernetes.io/vsphere-volume"), Err(no_code(Vsphere))),
    ];
    cases.extend(shared_errors());
    run_typed(Typed::Expandable, cases);
}

#[test]
fn find_node_expandable_table() {
    let mut cases = vec![
        (Key::Spec(csi_pv("p", CSI_FULL)), Ok(Some(CSI_FULL))),
        (Key::Name(CSI_FULL), Ok(Some(CSI_FULL))),
        (Key::Spec(csi_pv("p", CSI_NOATTACH)), Ok(Some(CSI_NOATTACH))),
        (Key::Name(CSI_NOATTACH), Ok(Some(CSI_NOATTACH))),
        // Controller expansion only.
        (Key::Spec(flex_pv("p", FLEX_ATTACH)), Ok(None)),
        (Key::Name(FLEX_ATTACH), Ok(None)),
        (Key::Spec(inline_empty_dir("v")), Ok(None)),
        (Key::Spec(inline_in_tree("v", Portworx)), Err(no_code(Portworx))),
        (Key::Name("kubernetes.io/gce-pd"), Err(no_code(GcePd))),
    ];
    cases.extend(shared_errors());
    run_typed(Typed::NodeExpandable, cases);
}

#[test]
fn find_provisionable_table() {
    let cases = vec![
        (Key::Name(CSI_FULL), Ok(Some(CSI_FULL))),
        (Key::Name(CSI_PICKY), Err(cannot(CSI_PICKY, "provision volumes"))),
        (Key::Name(FLEX_ATTACH), Err(cannot(FLEX_ATTACH, "provision volumes"))),
        (Key::Name(EMPTY_DIR), Err(cannot(EMPTY_DIR, "provision volumes"))),
        (Key::Name("kubernetes.io/portworx-volume"), Err(no_code(Portworx))),
        (Key::Name("nope"), Err(no_name("nope"))),
        (Key::Name(""), Err(no_name(""))),
    ];
    run_typed(Typed::Provisionable, cases);
}

#[test]
fn find_deletable_table() {
    let mut cases = vec![
        (Key::Spec(csi_pv("p", CSI_FULL)), Ok(Some(CSI_FULL))),
        (Key::Name(CSI_FULL), Ok(Some(CSI_FULL))),
        (Key::Spec(host_path_pv("p", "/srv")), Ok(Some(HOST_PATH))),
        (Key::Name(HOST_PATH), Ok(Some(HOST_PATH))),
        (Key::Spec(flex_pv("p", FLEX_ATTACH)), Err(cannot(FLEX_ATTACH, "delete volumes"))),
        (Key::Name(FLEX_ATTACH), Err(cannot(FLEX_ATTACH, "delete volumes"))),
        (Key::Spec(inline_empty_dir("v")), Err(cannot(EMPTY_DIR, "delete volumes"))),
        (Key::Spec(in_tree_pv("p", Rbd)), Err(no_code(Rbd))),
        (Key::Name("kubernetes.io/azure-file"), Err(no_code(AzureFile))),
    ];
    cases.extend(shared_errors());
    run_typed(Typed::Deletable, cases);
}

#[test]
fn in_tree_descriptors_are_found_but_every_operation_lookup_refuses_them() {
    let snap = standard().snapshot();
    for plugin in MigratablePlugin::ALL {
        let name = plugin.in_tree_name();
        for spec in [in_tree_pv("p", plugin), inline_in_tree("v", plugin)] {
            let found = snap.find_by_spec(&spec).unwrap_or_else(|e| panic!("{plugin}: {e}"));
            assert_eq!(
                (found.name(), found.kind(), found.migrates()),
                (name, PluginKind::InTree, Some(plugin))
            );
        }
        assert_eq!(name_of(snap.find_by_name(name)), Ok(name));
        for t in Typed::ALL {
            let want = if t == Typed::Persistent { Ok(Some(name.to_string())) } else { Err(no_code(plugin)) };
            assert_eq!(typed(&snap, t, &Key::Name(name)), want, "{t:?} by name {plugin}");
            if t != Typed::Provisionable {
                let got = typed(&snap, t, &Key::Spec(in_tree_pv("p", plugin)));
                assert_eq!(got, want, "{t:?} by spec {plugin}");
            }
        }
    }
}

#[test]
fn new_refuses_duplicate_compiled_in_names() {
    let fake = |name: &str| FakePlugin::field(name.to_string(), "emptyDir").build_ref();
    let rbd_twin = || {
        let mut plugins = in_tree_descriptors();
        plugins.push(FakePlugin::field("kubernetes.io/rbd", "rbd").build_ref());
        plugins
    };
    type Case = (&'static str, Vec<PluginRef>, Result<Vec<&'static str>, &'static str>);
    let cases: Vec<Case> = vec![
        ("none", vec![], Ok(vec![])),
        ("distinct names sharing a source", vec![fake("b"), fake("a")], Ok(vec!["b", "a"])),
        ("twice", vec![fake("a"), fake("a")], Err("volume plugin \"a\" is already registered")),
        (
            "the first clash is reported",
            vec![fake("a"), fake("b"), fake("b"), fake("a")],
            Err("volume plugin \"b\" is already registered"),
        ),
        (
            "a fake taking an in-tree name",
            rbd_twin(),
            Err("volume plugin \"kubernetes.io/rbd\" is already registered"),
        ),
    ];
    for (case, plugins, want) in cases {
        let got = PluginRegistry::new(plugins)
            .map(|r| r.snapshot().plugins().iter().map(|p| p.plugin.name().to_string()).collect::<Vec<_>>())
            .map_err(|e| e.to_string());
        let want = want.map(|names| names.into_iter().map(str::to_string).collect()).map_err(str::to_string);
        assert_eq!(got, want, "{case}");
    }
}

/// The registered plugins as `name owner[ persistent]`, in listing order: compiled-in as
/// registered, then the Flexvolume prober's and CSI registration's, each by name.
fn listing(snap: &Snapshot) -> Vec<String> {
    snap.plugins()
        .iter()
        .map(|r| {
            let owner = match r.source {
                None => "compiled-in",
                Some(Csi) => "csi",
                Some(Flexvolume) => "flexvolume",
            };
            let persistent = if r.plugin.is_persistent() { " persistent" } else { "" };
            format!("{} {owner}{persistent}", r.plugin.name())
        })
        .collect()
}

/// A batch or rescan publishes at most one snapshot, and exactly one when the listing changed.
fn assert_generation_step(before: &Snapshot, after: &Snapshot, step: &str) {
    let (b, a) = (before.generation(), after.generation());
    if listing(before) == listing(after) {
        assert!(a == b || a == b + 1, "{step}: generation {b} -> {a}");
    } else {
        assert_eq!(a, b + 1, "{step}: one snapshot per batch");
    }
}

fn small() -> PluginRegistry {
    let compiled = vec![
        FakePlugin::field(EMPTY_DIR, "emptyDir").build_ref(),
        Arc::new(InTreeDescriptor::new(Rbd)) as PluginRef,
    ];
    PluginRegistry::new(compiled).expect("unique names")
}

#[test]
fn dynamic_events_add_update_remove_and_refuse_clashes() {
    // (source, events, refusals, listing after)
    type Step = (DynamicSource, Vec<ProbeEvent>, &'static [&'static str], &'static [&'static str]);
    let base = ["kubernetes.io/empty-dir compiled-in", "kubernetes.io/rbd compiled-in persistent"];
    let steps: Vec<Step> = vec![
        (
            Csi,
            vec![add(FakePlugin::csi("b.csi")), add(FakePlugin::csi("a.csi"))],
            &[],
            &["a.csi csi persistent", "b.csi csi persistent"],
        ),
        // An update replaces the plugin under the same name.
        (
            Csi,
            vec![add(FakePlugin::csi("a.csi").persistent(false))],
            &[],
            &["a.csi csi", "b.csi csi persistent"],
        ),
        (Csi, vec![remove("b.csi")], &[], &["a.csi csi"]),
        // Removing what is not there changes nothing.
        (Csi, vec![remove("nope")], &[], &["a.csi csi"]),
        // A clash with another dynamic source is refused; the rest of the batch applies.
        (
            Flexvolume,
            vec![add(FakePlugin::flex("a.csi")), add(FakePlugin::flex("vendor/x"))],
            &["volume plugin \"a.csi\" is already registered by csi registration"],
            &["vendor/x flexvolume persistent", "a.csi csi"],
        ),
        // Clashes with compiled-in names (real and in-tree descriptors) are refused.
        (
            Csi,
            vec![
                add(FakePlugin::csi(EMPTY_DIR)),
                add(FakePlugin::csi("c.csi")),
                add(FakePlugin::csi("kubernetes.io/rbd")),
            ],
            &[
                "volume plugin \"kubernetes.io/empty-dir\" is already registered by compiled-in",
                "volume plugin \"kubernetes.io/rbd\" is already registered by compiled-in",
            ],
            &["vendor/x flexvolume persistent", "a.csi csi", "c.csi csi persistent"],
        ),
        // A source cannot remove another source's plugin.
        (
            Flexvolume,
            vec![remove("a.csi")],
            &[],
            &["vendor/x flexvolume persistent", "a.csi csi", "c.csi csi persistent"],
        ),
        (
            Csi,
            vec![add(FakePlugin::csi("vendor/x"))],
            &["volume plugin \"vendor/x\" is already registered by the flexvolume prober"],
            &["vendor/x flexvolume persistent", "a.csi csi", "c.csi csi persistent"],
        ),
        // Events apply in order within a batch.
        (
            Flexvolume,
            vec![
                remove("vendor/x"),
                add(FakePlugin::flex("vendor/x").persistent(false)),
                add(FakePlugin::flex("vendor/y")),
                remove("vendor/y"),
            ],
            &[],
            &["vendor/x flexvolume", "a.csi csi", "c.csi csi persistent"],
        ),
        // Once the owner removed it, the name is free for another source.
        (Csi, vec![remove("a.csi")], &[], &["vendor/x flexvolume", "c.csi csi persistent"]),
        (
            Flexvolume,
            vec![add(FakePlugin::flex("a.csi"))],
            &[],
            &["a.csi flexvolume persistent", "vendor/x flexvolume", "c.csi csi persistent"],
        ),
        (Csi, vec![], &[], &["a.csi flexvolume persistent", "vendor/x flexvolume", "c.csi csi persistent"]),
    ];
    let registry = small();
    assert_eq!(registry.snapshot().generation(), 0);
    assert_eq!(listing(&registry.snapshot()), base);
    for (i, (source, events, refused, after)) in steps.into_iter().enumerate() {
        let before = registry.snapshot();
        let got: Vec<String> = registry.apply(source, events).iter().map(ToString::to_string).collect();
        assert_eq!(got, refused, "step {i}");
        let snap = registry.snapshot();
        let want: Vec<&str> = base.iter().chain(after).copied().collect();
        assert_eq!(listing(&snap), want, "step {i}");
        assert_generation_step(&before, &snap, &format!("step {i}"));
    }
}

#[test]
fn updates_and_removals_reindex_lookups_by_spec() {
    let registry = small();
    assert!(registry.apply(Flexvolume, [add(FakePlugin::flex("vendor/a"))]).is_empty());
    let old_driver = flex_pv("p", "vendor/a");
    assert_eq!(name_of(registry.snapshot().find_by_spec(&old_driver)), Ok("vendor/a"));

    // The update serves another driver under the same name: the old index entry must go.
    let moved =
        FakePlugin::builder("vendor/a").kind(PluginKind::Flexvolume).serves(SourceKey::Flex("vendor/b"));
    assert!(registry.apply(Flexvolume, [add(moved)]).is_empty());
    let snap = registry.snapshot();
    assert_eq!(
        name_of(snap.find_by_spec(&old_driver)),
        Err(no_match("persistent volume \"p\"", "Flexvolume driver \"vendor/a\""))
    );
    assert_eq!(name_of(snap.find_by_spec(&flex_pv("p", "vendor/b"))), Ok("vendor/a"));

    assert!(registry.apply(Flexvolume, [remove("vendor/a")]).is_empty());
    let snap = registry.snapshot();
    assert_eq!(
        name_of(snap.find_by_spec(&flex_pv("p", "vendor/b"))),
        Err(no_match("persistent volume \"p\"", "Flexvolume driver \"vendor/b\""))
    );
    assert_eq!(name_of(snap.find_by_name("vendor/a")), Err(no_name("vendor/a")));
}

#[test]
fn replace_swaps_one_sources_plugins_for_the_new_set() {
    let registry = small();
    let csi = [add(FakePlugin::csi("a.csi")), add(FakePlugin::csi("b.csi")), add(FakePlugin::csi("c.csi"))];
    assert!(registry.apply(Csi, csi).is_empty());
    assert!(registry.apply(Flexvolume, [add(FakePlugin::flex("vendor/keep"))]).is_empty());
    let base = ["kubernetes.io/empty-dir compiled-in", "kubernetes.io/rbd compiled-in persistent"];

    // (source, new set, refusals, listing after)
    type Step = (DynamicSource, Vec<PluginRef>, &'static [&'static str], &'static [&'static str]);
    let steps: Vec<Step> = vec![
        (
            Csi,
            vec![
                FakePlugin::csi("d.csi").build_ref(),
                FakePlugin::csi("b.csi").persistent(false).build_ref(),
            ],
            &[],
            &["vendor/keep flexvolume persistent", "b.csi csi", "d.csi csi persistent"],
        ),
        (
            Csi,
            vec![FakePlugin::csi("vendor/keep").build_ref(), FakePlugin::csi("e.csi").build_ref()],
            &["volume plugin \"vendor/keep\" is already registered by the flexvolume prober"],
            &["vendor/keep flexvolume persistent", "e.csi csi persistent"],
        ),
        (
            Flexvolume,
            vec![FakePlugin::flex("vendor/new").build_ref()],
            &[],
            &["vendor/new flexvolume persistent", "e.csi csi persistent"],
        ),
        (Csi, vec![], &[], &["vendor/new flexvolume persistent"]),
    ];
    for (i, (source, plugins, refused, after)) in steps.into_iter().enumerate() {
        let before = registry.snapshot();
        let got: Vec<String> = registry.replace(source, plugins).iter().map(ToString::to_string).collect();
        assert_eq!(got, refused, "step {i}");
        let snap = registry.snapshot();
        let want: Vec<&str> = base.iter().chain(after).copied().collect();
        assert_eq!(listing(&snap), want, "step {i}");
        assert_generation_step(&before, &snap, &format!("step {i}"));
    }
    let snap = registry.snapshot();
    assert_eq!(name_of(snap.find_by_name("a.csi")), Err(no_name("a.csi")));
    assert_eq!(
        name_of(snap.find_by_spec(&csi_pv("p", "d.csi"))),
        Err(no_match("persistent volume \"p\"", "CSI driver \"d.csi\""))
    );
}

#[test]
fn a_held_snapshot_never_changes() {
    let registry = small();
    assert!(registry.apply(Csi, [add(FakePlugin::csi("a.csi").offers([Part::Attach]))]).is_empty());
    let old = registry.snapshot();
    assert!(Arc::ptr_eq(&old, &registry.snapshot()), "no change, same snapshot");
    let old_listing = listing(&old);
    let old_generation = old.generation();
    let held = Arc::clone(old.find_by_name("a.csi").expect("registered"));

    let errs = registry.apply(Csi, [remove("a.csi"), add(FakePlugin::csi("b.csi"))]);
    assert!(errs.is_empty());
    assert!(registry.replace(Flexvolume, vec![FakePlugin::flex("vendor/x").build_ref()]).is_empty());

    // The old snapshot still answers as before.
    assert_eq!(listing(&old), old_listing);
    assert_eq!(old.generation(), old_generation);
    assert_eq!(name_of(old.find_by_spec(&csi_pv("p", "a.csi"))), Ok("a.csi"));
    assert_eq!(old.find_attachable_by_spec(&csi_pv("p", "a.csi")).unwrap().map(|p| p.name()), Some("a.csi"));
    assert_eq!(name_of(old.find_by_name("b.csi")), Err(no_name("b.csi")));
    assert_eq!(name_of(old.find_by_name("vendor/x")), Err(no_name("vendor/x")));
    // A plugin handed out before its removal stays usable.
    assert!(held.attacher().is_some());

    let new = registry.snapshot();
    assert_eq!(new.generation(), old_generation + 2);
    assert_eq!(name_of(new.find_by_name("a.csi")), Err(no_name("a.csi")));
    assert_eq!(name_of(new.find_by_name("b.csi")), Ok("b.csi"));
    assert_eq!(name_of(new.find_by_name("vendor/x")), Ok("vendor/x"));
}

#[test]
fn readers_see_whole_snapshots_while_writers_change_the_registry() {
    // Readers must always find the stable driver, whatever the writers interleave: a rescan
    // that released its lock between dropping and re-adding its plugins let the other
    // writer publish a snapshot without them (this test caught that in most runs).
    const ROUNDS: usize = 10_000;
    const READERS: usize = 3;
    const STABLE: &str = "stable.csi.example.com";
    const FLAP_CSI: &str = "flap.csi.example.com";
    const FLAP_FLEX: &str = "vendor/flap";

    let registry = small();
    assert!(
        registry.replace(Csi, vec![FakePlugin::csi(STABLE).offers([Part::Attach]).build_ref()]).is_empty()
    );
    let done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);

    let flap_flex = flex_pv("v", FLAP_FLEX);
    let flap_csi = csi_pv("w", FLAP_CSI);
    let stable = csi_pv("s", STABLE);
    let flex_gone = no_match("persistent volume \"v\"", "Flexvolume driver \"vendor/flap\"");
    let csi_gone = no_match("persistent volume \"w\"", "CSI driver \"flap.csi.example.com\"");

    std::thread::scope(|s| {
        let writers = [
            // The Flexvolume prober adds and removes one driver.
            s.spawn(|| {
                for _ in 0..ROUNDS {
                    assert!(registry.apply(Flexvolume, [add(FakePlugin::flex(FLAP_FLEX))]).is_empty());
                    assert!(registry.apply(Flexvolume, [remove(FLAP_FLEX)]).is_empty());
                }
            }),
            // CSI registration rescans: the stable driver is in every set, another comes and goes.
            s.spawn(|| {
                let stable = || FakePlugin::csi(STABLE).offers([Part::Attach]).build_ref();
                for i in 0..ROUNDS {
                    let mut set = vec![stable()];
                    if i % 2 == 0 {
                        set.push(FakePlugin::csi(FLAP_CSI).build_ref());
                    }
                    assert!(registry.replace(Csi, set).is_empty());
                }
            }),
        ];
        for _ in 0..READERS {
            s.spawn(|| {
                let mut last_generation = 0;
                let mut n = 0u64;
                while !done.load(Ordering::Acquire) || n < 1_000 {
                    let snap = registry.snapshot();
                    assert!(snap.generation() >= last_generation, "generations only grow");
                    last_generation = snap.generation();

                    let by_spec = name_of(snap.find_by_spec(&flap_flex));
                    assert!(by_spec == Ok(FLAP_FLEX) || by_spec == Err(flex_gone.clone()), "{by_spec:?}");
                    let by_name = name_of(snap.find_by_name(FLAP_FLEX));
                    assert!(by_name == Ok(FLAP_FLEX) || by_name == Err(no_name(FLAP_FLEX)), "{by_name:?}");
                    assert_eq!(by_spec.is_ok(), by_name.is_ok(), "one snapshot, one answer");

                    let csi = name_of(snap.find_by_spec(&flap_csi));
                    assert!(csi == Ok(FLAP_CSI) || csi == Err(csi_gone.clone()), "{csi:?}");

                    assert_eq!(
                        name_of(snap.find_by_spec(&stable)),
                        Ok(STABLE),
                        "generation {last_generation}"
                    );
                    let attachable = registry
                        .snapshot()
                        .find_attachable_by_spec(&stable)
                        .map(|p| p.map(|p| p.name().to_string()));
                    assert_eq!(attachable.map_err(|e| e.to_string()), Ok(Some(STABLE.to_string())));
                    n += 1;
                }
                reads.fetch_add(n, Ordering::Relaxed);
            });
        }
        let joined: Vec<_> = writers.into_iter().map(|w| w.join()).collect();
        done.store(true, Ordering::Release);
        for result in joined {
            if let Err(panic) = result {
                std::panic::resume_unwind(panic);
            }
        }
    });

    let snap = registry.snapshot();
    assert_eq!(snap.generation(), 1 + 3 * ROUNDS as u64, "every batch and rescan published once");
    assert_eq!(listing(&snap)[2..], [format!("{STABLE} csi persistent")]);
    assert!(reads.load(Ordering::Relaxed) >= READERS as u64 * 1_000);
}
