//! The Flexvolume plugin on a recording driver: argv, options JSON, capabilities, "Not supported", fallbacks.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    FlexPersistentVolumeSource, FlexVolumeSource, LocalObjectReference, PersistentVolumeSpec, Secret,
    SecretReference, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvol_flex::{CallLimits, Command, FlexError, FlexVolumePlugin};
use kvol_plugin::mount::MountCall;
use kvol_plugin::plugin::{PodInfo, PublishRequest, UnpublishRequest};
use kvol_plugin::testing::{inline, pv, volume};
use kvol_plugin::{
    AccessMode, Capabilities, Mounter, NodeInfo, NodePaths, PluginHost, PluginKind, RecordingMounter,
    SecretMap, SourceKey, VolumePlugin, VolumeSpec,
};

const DRIVER: &str = "acme/lvm";

/// A node root, a recording driver installed as `acme~lvm/lvm`, and a recording mounter.
struct Fixture {
    _dir: kvol_test_support::ScratchRoot,
    root: PathBuf,
    state: PathBuf,
    driver_dir: PathBuf,
    mounter: Arc<RecordingMounter>,
    secrets: SecretMap,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = kvol_test_support::ScratchRoot::new();
        // Canonical, so the mount table's paths and ours agree.
        let base = dir.path().canonicalize().unwrap();
        let root = base.join("kubelet");
        let state = base.join("state");
        let driver_dir = base.join("exec").join("acme~lvm");
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&state).unwrap();
        fs::create_dir_all(&driver_dir).unwrap();
        // Records every call (command names in `calls`, the last argv of each command in
        // `argv.<command>`) and replies with `reply.<command>`, else Success.
        let body = format!(
            "#!/bin/sh\nstate='{}'\necho \"$1\" >> \"$state/calls\"\n\
             {{ echo \"$#\"; printf '%s\\n' \"$@\"; }} > \"$state/argv.$1\"\n\
             if [ -f \"$state/reply.$1\" ]; then cat \"$state/reply.$1\"\n\
             else echo '{{\"status\":\"Success\"}}'; fi\n",
            state.display()
        );
        let executable = driver_dir.join("lvm");
        fs::write(&executable, body).unwrap();
        fs::set_permissions(&executable, fs::Permissions::from_mode(0o755)).unwrap();
        Fixture {
            _dir: dir,
            root,
            state,
            driver_dir,
            mounter: Arc::new(RecordingMounter::new()),
            secrets: SecretMap::default(),
        }
    }

    fn reply(&self, command: &str, json: &str) -> &Self {
        fs::write(self.state.join(format!("reply.{command}")), json).unwrap();
        self
    }

    fn not_supported(&self, command: &str) -> &Self {
        self.reply(command, r#"{"status":"Not supported"}"#)
    }

    async fn load(&self) -> kvol_flex::error::Result<FlexVolumePlugin> {
        let limits = CallLimits { timeout: Duration::from_secs(20), ..CallLimits::default() };
        let driver = kvol_flex::naming::driver_in_dir(&self.driver_dir, limits).unwrap();
        let host =
            PluginHost::new(NodePaths::new(&self.root), NodeInfo::named("node-a"), self.mounter.clone())
                .with_secrets(Arc::new(self.secrets.clone()));
        FlexVolumePlugin::load(driver, host).await
    }

    async fn plugin(&self) -> FlexVolumePlugin {
        self.load().await.unwrap()
    }

    /// The commands called so far, in order.
    fn calls(&self) -> Vec<String> {
        fs::read_to_string(self.state.join("calls")).unwrap_or_default().lines().map(str::to_string).collect()
    }

    /// How often `command` was called.
    fn count(&self, command: &str) -> usize {
        self.calls().iter().filter(|c| *c == command).count()
    }

    /// The last argv of `command` after the command itself, checked against the count the
    /// driver saw.
    fn argv(&self, command: &str) -> Vec<String> {
        let text = fs::read_to_string(self.state.join(format!("argv.{command}"))).unwrap();
        let mut lines = text.lines().map(str::to_string);
        let count: usize = lines.next().unwrap().parse().unwrap();
        let argv: Vec<String> = lines.collect();
        assert_eq!(argv.len(), count, "{command}: {argv:?}");
        assert_eq!(argv[0], command);
        argv[1..].to_vec()
    }

    fn staging(&self, volume: &str) -> PathBuf {
        self.root.join("plugins/kubernetes.io/flexvolume/acme/lvm/mounts").join(volume)
    }

    fn target(&self, volume: &str) -> PathBuf {
        self.root.join("pods/uid-1/volumes/acme~lvm").join(volume)
    }
}

fn json(text: &str) -> BTreeMap<String, String> {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn flex_pv(name: &str, fs_type: Option<&str>, read_only: bool) -> VolumeSpec {
    pv(
        name,
        PersistentVolumeSpec {
            flex_volume: Some(FlexPersistentVolumeSource {
                driver: DRIVER.to_string(),
                fs_type: fs_type.map(str::to_string),
                ..FlexPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        },
    )
    .with_read_only(read_only)
}

fn inline_flex(name: &str, source: FlexVolumeSource) -> VolumeSpec {
    inline(Volume { flex_volume: Some(source), ..volume(name) })
}

fn pod() -> PodInfo {
    PodInfo {
        name: "web-0".into(),
        namespace: "shop".into(),
        uid: "uid-1".into(),
        service_account: "builder".into(),
        fs_group: None,
        fs_group_change_policy: kvol_plugin::plugin::FsGroupChangePolicy::Always,
        memory_limit: None,
    }
}

fn publish<'a>(spec: &'a VolumeSpec, pod: &'a PodInfo, target: &'a Path) -> PublishRequest<'a> {
    PublishRequest {
        spec,
        pod,
        pod_volume_name: spec.name(),
        target,
        staging_path: None,
        device_path: None,
        read_only: false,
        mount_options: &[],
        projection: None,
    }
}

fn unpublish(target: &Path) -> UnpublishRequest<'_> {
    UnpublishRequest { pod_uid: "uid-1", pod_volume_name: "vol", target, spec: None }
}

fn base_options(name: &str, fs_type: &str, rw: &str) -> BTreeMap<String, String> {
    map(&[
        ("kubernetes.io/fsType", fs_type),
        ("kubernetes.io/readwrite", rw),
        ("kubernetes.io/pvOrVolumeName", name),
    ])
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn secret(namespace: &str, name: &str, type_: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            ..ObjectMeta::default()
        },
        type_: Some(type_.to_string()),
        data: Some(BTreeMap::from([
            ("password".to_string(), ByteString(b"s3cr3t".to_vec())),
            ("user".to_string(), ByteString(b"admin".to_vec())),
        ])),
        ..Secret::default()
    }
}

#[tokio::test]
async fn init_chooses_an_attachable_plugin_by_default() {
    let f = Fixture::new();
    let plugin = f.plugin().await;
    assert_eq!(f.argv("init"), Vec::<String>::new(), "init takes no arguments");
    assert_eq!(plugin.name(), DRIVER);
    assert_eq!(plugin.kind(), PluginKind::Flexvolume);
    assert_eq!(plugin.serves(), vec![SourceKey::Flex(DRIVER)]);
    assert_eq!(plugin.access_modes(), vec![AccessMode::ReadWriteOnce, AccessMode::ReadOnlyMany]);
    assert_eq!(
        plugin.capabilities(),
        Capabilities {
            persistent: true,
            attachable: true,
            device_mountable: true,
            mountable: true,
            controller_expandable: true,
            node_expandable: true,
            provisionable: false,
            deletable: false,
        }
    );
    assert!(plugin.controller_expander().unwrap().requires_node_expansion());
    assert!(plugin.can_support(&flex_pv("pv-1", None, false)));
    assert!(
        plugin.can_support(&inline_flex(
            "vol",
            FlexVolumeSource { driver: DRIVER.into(), ..Default::default() }
        ))
    );
    assert!(!plugin.can_support(&kvol_plugin::testing::flex_pv("pv-2", "acme/other")));
    assert_eq!(plugin.volume_name(&flex_pv("pv-1", None, false)).unwrap(), "pv-1");
    assert_eq!(f.calls(), ["init"], "the volume name needs no getvolumename call");
}

#[tokio::test]
async fn init_without_attach_makes_a_mount_only_plugin() {
    let f = Fixture::new();
    f.reply("init", r#"{"status":"Success","capabilities":{"attach":false,"requiresFSResize":false}}"#);
    let plugin = f.plugin().await;
    let caps = plugin.capabilities();
    assert!(!caps.attachable && !caps.device_mountable, "{caps:?}");
    assert!(
        caps.mountable && caps.controller_expandable && caps.node_expandable && caps.persistent,
        "{caps:?}"
    );
    assert!(plugin.attacher().is_none() && plugin.device_mounter().is_none());
    assert!(!plugin.can_attach(&flex_pv("pv-1", None, false)));
    assert!(!plugin.controller_expander().unwrap().requires_node_expansion());
    assert!(!plugin.driver_capabilities().attach);
}

#[tokio::test]
async fn a_failing_init_loads_no_plugin() {
    let cases = [
        (
            r#"{"status":"Failure","message":"no lvm"}"#,
            "init command failed, status: Failure, reason: no lvm",
        ),
        (r#"{"status":"Not supported"}"#, "init is not supported"),
        ("garbage", "init printed output that is not a driver status"),
    ];
    for (reply, message) in cases {
        let f = Fixture::new();
        f.reply("init", reply);
        let err = f.load().await.unwrap_err();
        assert!(err.to_string().contains(message), "{reply}: {err}");
    }
}

#[tokio::test]
async fn attacher_calls_carry_upstreams_arguments() {
    let f = Fixture::new();
    let plugin = f.plugin().await;
    let spec = flex_pv("pv-1", Some("xfs"), true);
    let attacher = plugin.attacher().unwrap();
    let options = base_options("pv-1", "xfs", "ro");

    f.reply("attach", r#"{"status":"Success","device":"/dev/sdx"}"#);
    assert_eq!(attacher.attach(&spec, "node-a").await.unwrap().as_deref(), Some("/dev/sdx"));
    let argv = f.argv("attach");
    assert_eq!(argv.len(), 2);
    assert_eq!(json(&argv[0]), options);
    assert_eq!(argv[1], "node-a");

    f.reply("waitforattach", r#"{"status":"Success","device":"/dev/sdx1"}"#);
    let device = attacher.wait_for_attach(&spec, Some("/dev/sdx"), Duration::from_secs(10)).await.unwrap();
    assert_eq!(device, "/dev/sdx1");
    let argv = f.argv("waitforattach");
    assert_eq!(argv[0], "/dev/sdx");
    assert_eq!(json(&argv[1]), options);

    for (reply, attached) in
        [(r#"{"status":"Success","attached":true}"#, true), (r#"{"status":"Success"}"#, false)]
    {
        f.reply("isattached", reply);
        assert_eq!(attacher.is_attached(&spec, "node-b").await.unwrap(), attached, "{reply}");
        let argv = f.argv("isattached");
        assert_eq!(json(&argv[0]), options);
        assert_eq!(argv[1], "node-b");
    }

    let volume_name = plugin.volume_name(&spec).unwrap();
    attacher.detach(&volume_name, "node-a").await.unwrap();
    assert_eq!(f.argv("detach"), ["pv-1", "node-a"]);

    // An attach without a device says so with None.
    f.reply("attach", r#"{"status":"Success"}"#);
    assert_eq!(attacher.attach(&spec, "node-a").await.unwrap(), None);
}

#[tokio::test]
async fn staging_calls_mountdevice_and_unmountdevice() {
    let f = Fixture::new();
    let plugin = f.plugin().await;
    let spec = flex_pv("pv-1", Some("ext4"), false);
    let stager = plugin.device_mounter().unwrap();
    let staging = stager.device_mount_path(&spec).unwrap();
    assert_eq!(staging, f.staging("pv-1"));

    stager.stage(&spec, Some("/dev/sdx"), &staging).await.unwrap();
    let argv = f.argv("mountdevice");
    assert_eq!(argv[..2], [staging.display().to_string(), "/dev/sdx".to_string()]);
    assert_eq!(json(&argv[2]), base_options("pv-1", "ext4", "rw"));
    assert_eq!(argv.len(), 3);
    assert_eq!(mode(&staging), 0o750);
    assert_eq!(f.mounter.calls(), [], "the driver mounted, not kvol");

    // The driver's mount as the mount table would show it.
    f.mounter.mount("/dev/sdx", &staging, "ext4", false, &[]).unwrap();
    stager.stage(&spec, Some("/dev/sdx"), &staging).await.unwrap();
    assert_eq!(f.count("mountdevice"), 1, "an already mounted staging path is left alone");

    stager.unstage(&staging).await.unwrap();
    assert_eq!(f.argv("unmountdevice"), [staging.display().to_string()]);
    assert!(!staging.exists(), "the directory the driver left is removed");
    assert!(stager.unstage(&staging).await.is_ok(), "a staging path already gone is done");
    assert_eq!(f.count("unmountdevice"), 1);
}

#[tokio::test]
async fn unstaging_an_unmounted_path_skips_the_driver() {
    let f = Fixture::new();
    let plugin = f.plugin().await;
    let staging = f.staging("pv-1");
    fs::create_dir_all(&staging).unwrap();
    plugin.device_mounter().unwrap().unstage(&staging).await.unwrap();
    assert_eq!(f.count("unmountdevice"), 0);
    assert!(!staging.exists());
}

#[tokio::test]
async fn publishing_calls_mount_with_pod_options_and_unpublishing_calls_unmount() {
    let f = Fixture::new();
    let plugin = f.plugin().await;
    let spec = flex_pv("pv-1", Some("xfs"), false);
    let pod = PodInfo { fs_group: Some(2000), ..pod() };
    let target = f.target("pv-1");
    let mounter = plugin.mounter().unwrap();

    mounter.publish(&publish(&spec, &pod, &target)).await.unwrap();
    let argv = f.argv("mount");
    assert_eq!(argv.len(), 2);
    assert_eq!(argv[0], target.display().to_string());
    let mut expected = base_options("pv-1", "xfs", "rw");
    expected.extend(map(&[
        ("kubernetes.io/pod.name", "web-0"),
        ("kubernetes.io/pod.namespace", "shop"),
        ("kubernetes.io/pod.uid", "uid-1"),
        ("kubernetes.io/serviceAccount.name", "builder"),
        ("kubernetes.io/mounterArgs.FsGroup", "2000"),
    ]));
    assert_eq!(json(&argv[1]), expected);
    // The driver mounted read-write and said nothing of fsGroup: kubelet gives the volume the
    // pod's fsGroup itself (g+rwx and setgid on the 0750 directory).
    assert_eq!(mode(&target), 0o770);
    assert_ne!(std::os::unix::fs::MetadataExt::mode(&fs::metadata(&target).unwrap()) & 0o2000, 0, "setgid");
    assert_eq!(std::os::unix::fs::MetadataExt::gid(&fs::metadata(&target).unwrap()), 2000);

    mounter.unpublish(&unpublish(&target)).await.unwrap();
    assert_eq!(f.argv("unmount"), [target.display().to_string()]);
    assert!(!target.exists());
    mounter.unpublish(&unpublish(&target)).await.unwrap();
    assert_eq!(f.count("unmount"), 1, "a target already gone needs no unmount");
    assert_eq!(f.mounter.calls(), []);
}

#[tokio::test]
async fn the_pods_fs_group_is_given_unless_the_driver_takes_none_or_the_volume_is_read_only() {
    use std::os::unix::fs::MetadataExt;
    // (what, init's capabilities, read-only, the target's mode and gid after publish)
    let rows = [
        ("a driver that says nothing", "{}", false, (0o2770, 2000)),
        ("a driver that takes no fsGroup", r#"{"attach": false, "fsGroup": false}"#, false, (0o750, 0)),
        ("a read-only volume", "{}", true, (0o750, 0)),
    ];
    for (what, capabilities, read_only, want) in rows {
        let f = Fixture::new();
        f.reply("init", &format!(r#"{{"status":"Success","capabilities":{capabilities}}}"#));
        let plugin = f.plugin().await;
        let spec = flex_pv("pv-1", None, read_only);
        let pod = PodInfo { fs_group: Some(2000), ..pod() };
        let target = f.target("pv-1");
        plugin.mounter().unwrap().publish(&publish(&spec, &pod, &target)).await.unwrap();
        let meta = fs::metadata(&target).unwrap();
        assert_eq!((meta.mode() & 0o7777, meta.gid()), want, "{what}");
    }
}

#[tokio::test]
async fn an_already_mounted_target_is_not_mounted_again() {
    let f = Fixture::new();
    let plugin = f.plugin().await;
    let spec = flex_pv("pv-1", None, false);
    let target = f.target("pv-1");
    fs::create_dir_all(&target).unwrap();
    f.mounter.bind(Path::new("/elsewhere"), &target, false).unwrap();
    plugin.mounter().unwrap().publish(&publish(&spec, &pod(), &target)).await.unwrap();
    assert_eq!(f.count("mount"), 0);
}

#[tokio::test]
async fn a_failed_mount_removes_the_target() {
    let f = Fixture::new();
    f.reply("mount", r#"{"status":"Failure","message":"device busy"}"#);
    let plugin = f.plugin().await;
    let spec = flex_pv("pv-1", None, false);
    let target = f.target("pv-1");
    let err = plugin.mounter().unwrap().publish(&publish(&spec, &pod(), &target)).await.unwrap_err();
    assert!(err.to_string().ends_with("mount command failed, status: Failure, reason: device busy"), "{err}");
    assert!(!target.exists());
    assert!(target.parent().unwrap().exists(), "only the target itself goes");
}

#[tokio::test]
async fn secrets_of_the_driver_type_reach_mount_base64_encoded() {
    let mut f = Fixture::new();
    f.secrets.insert(secret("shop", "creds", DRIVER));
    f.secrets.insert(secret("vault", "creds", DRIVER));
    let plugin = f.plugin().await;
    let expected_secret_keys =
        map(&[("kubernetes.io/secret/password", "czNjcjN0"), ("kubernetes.io/secret/user", "YWRtaW4=")]);

    // Inline: the reference's name in the pod's namespace.
    let spec = inline_flex(
        "vol",
        FlexVolumeSource {
            driver: DRIVER.into(),
            secret_ref: Some(LocalObjectReference { name: "creds".into() }),
            ..Default::default()
        },
    );
    let target = f.target("vol");
    plugin.mounter().unwrap().publish(&publish(&spec, &pod(), &target)).await.unwrap();
    let options = json(&f.argv("mount")[1]);
    for (key, value) in &expected_secret_keys {
        assert_eq!(options.get(key), Some(value), "{key}");
    }
    assert!(!options.contains_key("kubernetes.io/mounterArgs.FsGroup"), "no fsGroup, no key");

    // A PV: its own namespace.
    let pv_spec = pv(
        "pv-1",
        PersistentVolumeSpec {
            flex_volume: Some(FlexPersistentVolumeSource {
                driver: DRIVER.into(),
                secret_ref: Some(SecretReference {
                    name: Some("creds".into()),
                    namespace: Some("vault".into()),
                }),
                ..Default::default()
            }),
            ..PersistentVolumeSpec::default()
        },
    );
    plugin.mounter().unwrap().publish(&publish(&pv_spec, &pod(), &f.target("pv-1"))).await.unwrap();
    assert_eq!(json(&f.argv("mount")[1])["kubernetes.io/secret/user"], "YWRtaW4=");

    // Other calls never see Secrets.
    plugin.attacher().unwrap().attach(&spec, "node-a").await.unwrap();
    assert!(!f.argv("attach")[0].contains("kubernetes.io/secret"));
}

#[tokio::test]
async fn a_secret_of_another_type_or_a_missing_one_aborts_mount() {
    let mut f = Fixture::new();
    f.secrets.insert(secret("shop", "opaque", "Opaque"));
    let plugin = f.plugin().await;
    let cases = [
        ("opaque", "cannot get secret shop/opaque: it has type \"Opaque\""),
        ("missing", "cannot get secret shop/missing: there is no such secret"),
    ];
    for (name, message) in cases {
        let spec = inline_flex(
            "vol",
            FlexVolumeSource {
                driver: DRIVER.into(),
                secret_ref: Some(LocalObjectReference { name: name.into() }),
                ..Default::default()
            },
        );
        let target = f.target("vol");
        let err = plugin.mounter().unwrap().publish(&publish(&spec, &pod(), &target)).await.unwrap_err();
        assert!(err.to_string().contains(message), "{name}: {err}");
        assert!(err.to_string().starts_with("volume plugin acme/lvm: flexvolume driver acme/lvm: "), "{err}");
        assert!(!target.exists(), "{name}: the target is removed");
    }
    assert_eq!(f.count("mount"), 0, "the driver is never called");
}

#[tokio::test]
async fn user_options_override_everything() {
    let f = Fixture::new();
    let plugin = f.plugin().await;
    let spec = inline_flex(
        "vol",
        FlexVolumeSource {
            driver: DRIVER.into(),
            fs_type: Some("ext4".into()),
            read_only: Some(true),
            options: Some(map(&[
                ("kubernetes.io/readwrite", "rw"),
                ("kubernetes.io/pod.name", "spoofed"),
                ("size", "10Gi"),
            ])),
            ..Default::default()
        },
    );
    plugin.mounter().unwrap().publish(&publish(&spec, &pod(), &f.target("vol"))).await.unwrap();
    let options = json(&f.argv("mount")[1]);
    assert_eq!(options["kubernetes.io/readwrite"], "rw");
    assert_eq!(options["kubernetes.io/pod.name"], "spoofed");
    assert_eq!(options["size"], "10Gi");
    assert_eq!(options["kubernetes.io/fsType"], "ext4");
    assert_eq!(options["kubernetes.io/pvOrVolumeName"], "vol");
}

#[tokio::test]
async fn expansion_calls_carry_sizes_and_paths() {
    let f = Fixture::new();
    let plugin = f.plugin().await;
    let spec = flex_pv("pv-1", Some("ext4"), false);
    let grown = plugin.controller_expander().unwrap().expand(&spec, 2048, 1024).await.unwrap();
    assert_eq!(grown, 2048);
    let argv = f.argv("expandvolume");
    assert_eq!(json(&argv[0]), base_options("pv-1", "ext4", "rw"));
    assert_eq!(argv[1..], [f.staging("pv-1").display().to_string(), "2048".into(), "1024".into()]);

    let staging = f.staging("pv-1");
    plugin
        .node_expander()
        .unwrap()
        .expand_on_node(&spec, Some("/dev/sdx"), &staging, 4096, 2048)
        .await
        .unwrap();
    let argv = f.argv("expandfs");
    assert_eq!(json(&argv[0]), base_options("pv-1", "ext4", "rw"));
    assert_eq!(
        argv[1..],
        ["/dev/sdx".to_string(), staging.display().to_string(), "4096".into(), "2048".into()]
    );
    plugin.expand_fs(&spec, None, &staging, 4096, 2048).await.unwrap();
    assert_eq!(
        f.argv("expandfs")[1..],
        ["".to_string(), staging.display().to_string(), "4096".into(), "2048".into()]
    );

    let inline_spec = inline_flex("vol", FlexVolumeSource { driver: DRIVER.into(), ..Default::default() });
    let err = plugin.expand_fs(&inline_spec, None, &staging, 1, 0).await.unwrap_err();
    assert!(err.to_string().contains("needs a persistent volume"), "{err}");
}

#[tokio::test]
async fn not_supported_is_asked_once_per_plugin_instance() {
    let f = Fixture::new();
    f.not_supported("mount");
    let plugin = f.plugin().await;
    let spec = flex_pv("pv-1", None, false);
    for target in ["a", "b"] {
        let target = f.target(target);
        plugin.mounter().unwrap().publish(&publish(&spec, &pod(), &target)).await.unwrap();
    }
    assert_eq!(f.count("mount"), 1, "the second publish went straight to the default");
    assert_eq!(plugin.unsupported_commands(), [Command::Mount]);
    let binds = f.mounter.calls().into_iter().filter(|c| matches!(c, MountCall::Bind { .. })).count();
    assert_eq!(binds, 2);

    // A new instance (the prober's reload) asks again.
    let reloaded = f.plugin().await;
    assert_eq!(reloaded.unsupported_commands(), []);
    reloaded.mounter().unwrap().publish(&publish(&spec, &pod(), &f.target("c"))).await.unwrap();
    assert_eq!(f.count("mount"), 2);
}

#[tokio::test]
async fn attacher_defaults_follow_upstream() {
    let f = Fixture::new();
    for command in ["attach", "waitforattach", "isattached", "detach"] {
        f.not_supported(command);
    }
    let plugin = f.plugin().await;
    let spec = flex_pv("pv-1", None, false);
    let attacher = plugin.attacher().unwrap();
    for _ in 0..2 {
        assert_eq!(attacher.attach(&spec, "node-a").await.unwrap(), None, "no device");
        let device = attacher.wait_for_attach(&spec, Some("/dev/given"), Duration::ZERO).await.unwrap();
        assert_eq!(device, "/dev/given", "the given device path");
        assert_eq!(attacher.wait_for_attach(&spec, None, Duration::ZERO).await.unwrap(), "");
        assert!(attacher.is_attached(&spec, "node-a").await.unwrap(), "no information leaves it attached");
        attacher.detach("pv-1", "node-a").await.unwrap();
    }
    for command in ["attach", "waitforattach", "isattached", "detach"] {
        assert_eq!(f.count(command), 1, "{command}");
    }
}

#[tokio::test]
async fn mountdevice_default_mounts_the_device_with_the_spec_fstype() {
    let f = Fixture::new();
    f.not_supported("mountdevice");
    let plugin = f.plugin().await;
    let stager = plugin.device_mounter().unwrap();
    let cases = [
        (flex_pv("xfs-ro", Some("xfs"), true), "xfs", true),
        (flex_pv("default-fs", None, false), "ext4", false),
    ];
    for (spec, fstype, read_only) in cases {
        let staging = stager.device_mount_path(&spec).unwrap();
        stager.stage(&spec, Some("/dev/sdx"), &staging).await.unwrap();
        let expected = MountCall::Mount {
            source: "/dev/sdx".into(),
            target: staging.clone(),
            fstype: fstype.into(),
            read_only,
            data: vec![],
        };
        assert_eq!(f.mounter.calls().last(), Some(&expected), "{}", spec.name());
    }
    // Without a device there is nothing to mount.
    let calls_before = f.mounter.calls().len();
    let spec = flex_pv("no-device", None, false);
    let staging = stager.device_mount_path(&spec).unwrap();
    stager.stage(&spec, None, &staging).await.unwrap();
    assert_eq!(f.mounter.calls().len(), calls_before);
    assert_eq!(f.count("mountdevice"), 1);
}

#[tokio::test]
async fn a_failed_default_device_mount_says_kvol_does_not_format_and_cleans_up() {
    let f = Fixture::new();
    f.not_supported("mountdevice");
    let plugin = f.plugin().await;
    let spec = flex_pv("pv-1", None, false);
    let staging = f.staging("pv-1");
    f.mounter.fail_next(std::io::ErrorKind::InvalidInput);
    let err = plugin.device_mounter().unwrap().stage(&spec, Some("/dev/sdx"), &staging).await.unwrap_err();
    assert!(err.to_string().contains("kvol does not format devices"), "{err}");
    assert!(!staging.exists());
}

#[tokio::test]
async fn unmountdevice_default_unmounts_and_removes() {
    let f = Fixture::new();
    f.not_supported("unmountdevice");
    let plugin = f.plugin().await;
    let staging = f.staging("pv-1");
    fs::create_dir_all(&staging).unwrap();
    f.mounter.mount("/dev/sdx", &staging, "ext4", false, &[]).unwrap();
    plugin.device_mounter().unwrap().unstage(&staging).await.unwrap();
    assert_eq!(f.mounter.calls().last(), Some(&MountCall::Unmount { target: staging.clone() }));
    assert!(!staging.exists());
    assert_eq!(f.count("unmountdevice"), 1);
}

#[tokio::test]
async fn mount_default_binds_the_staging_path() {
    let f = Fixture::new();
    f.not_supported("mount");
    let plugin = f.plugin().await;
    let pod = pod();
    let cases = [
        (flex_pv("pv-rw", None, false), false, false),
        (flex_pv("pv-ro", None, true), false, true),
        (flex_pv("pod-ro", None, false), true, true),
    ];
    for (spec, request_ro, bound_ro) in cases {
        let target = f.target(spec.name());
        let req = PublishRequest { read_only: request_ro, ..publish(&spec, &pod, &target) };
        plugin.mounter().unwrap().publish(&req).await.unwrap();
        let expected =
            MountCall::Bind { source: f.staging(spec.name()), target: target.clone(), read_only: bound_ro };
        assert_eq!(f.mounter.calls().last(), Some(&expected));
    }
}

#[tokio::test]
async fn unmount_default_unmounts_and_removes_the_target() {
    let f = Fixture::new();
    f.not_supported("unmount");
    let plugin = f.plugin().await;
    let target = f.target("pv-1");
    fs::create_dir_all(&target).unwrap();
    f.mounter.bind(&f.staging("pv-1"), &target, false).unwrap();
    plugin.mounter().unwrap().unpublish(&unpublish(&target)).await.unwrap();
    assert_eq!(f.mounter.calls().last(), Some(&MountCall::Unmount { target: target.clone() }));
    assert!(!target.exists());
}

#[tokio::test]
async fn expansion_defaults() {
    let f = Fixture::new();
    f.not_supported("expandvolume").not_supported("expandfs");
    let plugin = f.plugin().await;
    let spec = flex_pv("pv-1", None, false);
    assert_eq!(plugin.controller_expander().unwrap().expand(&spec, 4096, 1024).await.unwrap(), 4096);
    let staging = f.staging("pv-1");
    // kubelet's fallback, a generic resize of the filesystem on the device: without a device
    // there is nothing to grow, and an unknown device's filesystem cannot be found.
    let err =
        plugin.node_expander().unwrap().expand_on_node(&spec, None, &staging, 4096, 2048).await.unwrap_err();
    assert!(err.to_string().contains("does not grow filesystems (expandfs) and names no device"), "{err}");
    let missing = f.staging("no-such-device");
    let device = missing.to_str().unwrap();
    let err = plugin
        .node_expander()
        .unwrap()
        .expand_on_node(&spec, Some(device), &staging, 4096, 2048)
        .await
        .unwrap_err();
    assert!(err.to_string().contains(device), "names the device: {err}");
}

#[tokio::test]
async fn specs_of_other_drivers_or_unusable_names_are_refused() {
    let f = Fixture::new();
    let plugin = f.plugin().await;
    let other = kvol_plugin::testing::flex_pv("pv-1", "acme/other");
    let err = plugin.attacher().unwrap().attach(&other, "node-a").await.unwrap_err();
    assert!(err.to_string().contains("it names flexvolume driver \"acme/other\", not \"acme/lvm\""), "{err}");
    for name in ["", ".", ".."] {
        let err = plugin.volume_name(&flex_pv(name, None, false)).unwrap_err();
        assert!(err.to_string().contains("cannot name a staging directory"), "{name:?}: {err}");
    }
    assert_eq!(f.calls(), ["init"]);
}

#[tokio::test]
async fn driver_errors_become_plugin_errors_naming_the_driver() {
    let f = Fixture::new();
    f.reply("detach", r#"{"status":"Failure","message":"still in use"}"#);
    let plugin = f.plugin().await;
    let err = plugin.attacher().unwrap().detach("pv-1", "node-a").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "volume plugin acme/lvm: flexvolume driver acme/lvm: detach command failed, \
         status: Failure, reason: still in use"
    );
    let source = std::error::Error::source(&err).unwrap();
    assert!(matches!(source.downcast_ref::<FlexError>(), Some(FlexError::Failed { command: "detach", .. })));
}
