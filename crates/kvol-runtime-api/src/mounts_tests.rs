//! Table tests of the container mount planner.

use super::*;

fn pod(containers: &str) -> Pod {
    let text = format!(
        "metadata: {{name: web, namespace: shop, uid: u1, labels: {{app: web}}}}\n\
         spec: {{nodeName: n1, containers: {containers}}}"
    );
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn volumes() -> BTreeMap<String, PublishedVolume> {
    let v = |path: &str, read_only, managed, block| PublishedVolume {
        host_path: PathBuf::from(path),
        read_only,
        managed,
        block,
    };
    BTreeMap::from([
        ("data".to_string(), v("/k/pods/u1/volumes/kubernetes.io~csi/pv1/mount", false, false, false)),
        ("cache".to_string(), v("/k/pods/u1/volumes/kubernetes.io~empty-dir/cache", false, true, false)),
        ("cfg".to_string(), v("/k/pods/u1/volumes/kubernetes.io~configmap/cfg", true, true, false)),
        ("disk".to_string(), v("/k/pods/u1/volumeDevices/kubernetes.io~csi/pv2", false, false, true)),
    ])
}

/// One line per mount: `container ← host ro/rw relabel propagation`; devices likewise.
fn describe(plan: &ContainerPlan) -> Vec<String> {
    let mut out: Vec<String> = plan
        .mounts
        .iter()
        .map(|m| {
            let host = match &m.host {
                HostSide::Volume(p) => p.display().to_string(),
                HostSide::SubPath { volume_dir, sub_path, dest } => {
                    format!("{} [{sub_path} of {}]", dest.display(), volume_dir.display())
                }
            };
            let access = if m.read_only { "ro" } else { "rw" };
            let relabel = if m.selinux_relabel { " relabel" } else { "" };
            format!("{} <- {host} {access}{relabel} {:?}", m.container_path, m.propagation)
        })
        .collect();
    out.extend(
        plan.devices
            .iter()
            .map(|d| format!("dev {} <- {} {}", d.container_path, d.host_path.display(), d.permissions)),
    );
    out
}

/// (what, the pod's containers, the mounts described or the error)
type Case = (&'static str, &'static str, Result<&'static [&'static str], &'static str>);

#[test]
fn mounts_are_made_as_kubelet_makes_them() {
    let cases: &[Case] = &[
        (
            "plain volumes: a read-only volume stays read-only, managed ones relabel",
            "[{name: c, volumeMounts: [{name: data, mountPath: /data}, {name: cfg, mountPath: /etc/cfg}, {name: cache, mountPath: tmp, readOnly: true}]}]",
            Ok(&[
                "/data <- /k/pods/u1/volumes/kubernetes.io~csi/pv1/mount rw Private",
                "/etc/cfg <- /k/pods/u1/volumes/kubernetes.io~configmap/cfg ro relabel Private",
                "/tmp <- /k/pods/u1/volumes/kubernetes.io~empty-dir/cache ro relabel Private",
            ]),
        ),
        (
            "subPath: bound under volume-subpaths/<volume>/<container>/<index>",
            "[{name: c, volumeMounts: [{name: data, mountPath: /a}, {name: cfg, mountPath: /etc/app.conf, subPath: app.conf}]}]",
            Ok(&[
                "/a <- /k/pods/u1/volumes/kubernetes.io~csi/pv1/mount rw Private",
                "/etc/app.conf <- /k/pods/u1/volume-subpaths/cfg/c/1 [app.conf of /k/pods/u1/volumes/kubernetes.io~configmap/cfg] ro relabel Private",
            ]),
        ),
        (
            "subPathExpr: from the container's env (a value, a fieldRef), $$ a literal $",
            "[{name: c, env: [{name: POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}, {name: DIR, value: logs}], volumeMounts: [{name: data, mountPath: /l, subPathExpr: '$(DIR)/$(POD)/$$(DIR)'}]}]",
            Ok(&[
                "/l <- /k/pods/u1/volume-subpaths/data/c/0 [logs/web/$(DIR) of /k/pods/u1/volumes/kubernetes.io~csi/pv1/mount] rw Private",
            ]),
        ),
        (
            "subPathExpr naming a variable kvol cannot tell: refused, as kubelet refuses an unset one",
            "[{name: c, env: [{name: K, valueFrom: {secretKeyRef: {name: s, key: k}}}], volumeMounts: [{name: data, mountPath: /l, subPathExpr: '$(K)/$(NOPE)'}]}]",
            Err("volumeMount \"data\" at \"/l\": subPathExpr \"$(K)/$(NOPE)\": missing value for K, NOPE"),
        ),
        (
            "propagation: None is private, HostToContainer for anyone, Bidirectional when privileged",
            "[{name: c, securityContext: {privileged: true}, volumeMounts: [{name: data, mountPath: /a, mountPropagation: None}, {name: cache, mountPath: /b, mountPropagation: HostToContainer}, {name: cfg, mountPath: /c, mountPropagation: Bidirectional}]}]",
            Ok(&[
                "/a <- /k/pods/u1/volumes/kubernetes.io~csi/pv1/mount rw Private",
                "/b <- /k/pods/u1/volumes/kubernetes.io~empty-dir/cache rw relabel HostToContainer",
                "/c <- /k/pods/u1/volumes/kubernetes.io~configmap/cfg ro relabel Bidirectional",
            ]),
        ),
        (
            "a block volume is a device",
            "[{name: c, volumeDevices: [{name: disk, devicePath: /dev/xvda}]}]",
            Ok(&["dev /dev/xvda <- /k/pods/u1/volumeDevices/kubernetes.io~csi/pv2 mrw"]),
        ),
        (
            "every reason, not the first",
            "[{name: c, volumeMounts: [{name: gone, mountPath: /a}, {name: data, mountPath: /b, mountPropagation: Bidirectional}, {name: data, mountPath: /c, subPath: ../../etc}, {name: data, mountPath: /d, subPath: /etc}, {name: disk, mountPath: /e}], volumeDevices: [{name: data, devicePath: /dev/x}]}]",
            Err("volumeMount \"gone\" at \"/a\": the volume is not published; \
                 volumeMount \"data\" at \"/b\": Bidirectional mount propagation is available only to privileged containers; \
                 volumeMount \"data\" at \"/c\": unable to provision SubPath `../../etc`: must not contain '..'; \
                 volumeMount \"data\" at \"/d\": error SubPath `/etc` must not be an absolute path; \
                 volumeMount \"disk\" at \"/e\": the volume is a block volume: use volumeDevices; \
                 volumeDevice \"data\": the volume is not a block volume"),
        ),
        ("a container that is not there", "[{name: c}]", Err("the pod has no container \"ghost\"")),
    ];
    for (what, containers, want) in cases {
        let pod = pod(containers);
        let name = match *what {
            "a container that is not there" => "ghost",
            _ => "c",
        };
        let got = plan(&pod, Path::new("/k/pods/u1"), name, &volumes()).map(|p| describe(&p));
        match (got, want) {
            (Ok(got), Ok(want)) => assert_eq!(got, *want, "{what}"),
            (Err(got), Err(want)) => assert_eq!(got, *want, "{what}"),
            (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn init_containers_are_found() {
    let pod: Pod = serde_saphyr::from_str(
        "metadata: {name: web, uid: u1}\nspec: {containers: [{name: main}], \
         initContainers: [{name: init, volumeMounts: [{name: cache, mountPath: /w}]}]}",
    )
    .unwrap();
    let got = plan(&pod, Path::new("/k/pods/u1"), "init", &volumes()).map(|p| describe(&p)).unwrap();
    assert_eq!(got, ["/w <- /k/pods/u1/volumes/kubernetes.io~empty-dir/cache rw relabel Private"]);
}
