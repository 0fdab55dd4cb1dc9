//! A pod runner in a test, on the runtime API: a pod handed to the real `kvol agent`, its volumes waited for, each container's mounts turned into an OCI `config.json` and run by Debian's `runc` on a `busybox-static` root — the container writes a CSI claim and an emptyDir, reads a ConfigMap key through a subPath, is refused writing a read-only mount, sees a block claim as a device; then the pod taken back and its teardown waited for.
//!
//! Needs `KVOL_RUNC` (a runc binary) and `KVOL_BUSYBOX` (a static busybox); skipped, saying
//! so, without them. Runs as root in a private mount namespace.

#[allow(dead_code)]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use kvol_runtime_api::proto::{AdmitPodRequest, ContainerMountsRequest, ReleasePodRequest, WaitRequest};
use serde_json::{Value, json};
use support::{Node, enter_private_mount_namespace};

const STORAGE: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: kvol-hostpath}
provisioner: hostpath.csi.kvol.io
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default}
spec:
  storageClassName: kvol-hostpath
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 16Mi}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: blk, namespace: default}
spec:
  storageClassName: kvol-hostpath
  volumeMode: Block
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 16Mi}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: app, namespace: default}
data: {app.conf: "greeting=hello from a configmap\n", other: "not mounted\n"}
"#;

/// The runner's own pod: no manifest has it.
const POD: &str = r#"{"apiVersion": "v1", "kind": "Pod",
  "metadata": {"name": "runner-pod", "namespace": "default", "uid": "7a1e0000-0000-4000-8000-00000000c0de"},
  "spec": {"containers": [{"name": "main", "image": "busybox",
      "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
      "volumeMounts": [
        {"name": "data", "mountPath": "/data"},
        {"name": "scratch", "mountPath": "/scratch", "subPathExpr": "$(POD)"},
        {"name": "cfg", "mountPath": "/etc/app.conf", "subPath": "app.conf"},
        {"name": "cfg", "mountPath": "/etc/cfg"},
        {"name": "data", "mountPath": "/data-ro", "readOnly": true}],
      "volumeDevices": [{"name": "blk", "devicePath": "/dev/xvda"}]}],
    "volumes": [
      {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
      {"name": "scratch", "emptyDir": {}},
      {"name": "cfg", "configMap": {"name": "app"}},
      {"name": "blk", "persistentVolumeClaim": {"claimName": "blk"}}]}}"#;

const UID: &str = "7a1e0000-0000-4000-8000-00000000c0de";

/// What the container runs: each line's outcome on stdout.
const SCRIPT: &str = r#"
echo written-by-the-container > /data/out && echo data=ok
echo scratch > /scratch/out && echo scratch=ok
echo "conf=$(cat /etc/app.conf)"
if (echo x > /data-ro/nope) 2>/tmp/err; then echo ro=writable; else echo "ro=$(cat /tmp/err)"; fi
if (echo x > /etc/cfg/nope) 2>/tmp/err; then echo cfg=writable; else echo "cfg=$(cat /tmp/err)"; fi
if [ -b /dev/xvda ]; then echo block=device; else echo block=missing; fi
ls /etc/cfg | tr '\n' ' ' | sed 's/^/cfg-files=/'; echo
"#;

fn binaries() -> Option<(PathBuf, PathBuf)> {
    match (std::env::var_os("KVOL_RUNC"), std::env::var_os("KVOL_BUSYBOX")) {
        (Some(runc), Some(busybox)) => Some((runc.into(), busybox.into())),
        _ => {
            eprintln!(
                "skipped: set KVOL_RUNC (a runc binary) and KVOL_BUSYBOX (a static busybox) to run a real container"
            );
            None
        }
    }
}

/// A root filesystem of one static busybox and its applet links.
fn rootfs(dir: &Path, busybox: &Path) -> PathBuf {
    let root = dir.join("rootfs");
    for sub in ["bin", "proc", "dev", "tmp", "etc", "data", "data-ro", "scratch"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    std::fs::copy(busybox, root.join("bin/busybox")).unwrap();
    for applet in ["sh", "echo", "cat", "ls", "tr", "sed", "["] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    root
}

/// The OCI config: busybox's shell running [`SCRIPT`], kvol's mounts and devices.
fn config(rootfs: &Path, oci: &Value) -> Value {
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"]}),
    ];
    mounts.extend(oci["mounts"].as_array().unwrap().iter().cloned());
    // Every device denied but those kvol hands over.
    let mut device_rules = vec![json!({"allow": false, "access": "rwm"})];
    device_rules.extend(oci["linux"]["resources"]["devices"].as_array().unwrap().iter().cloned());
    json!({
        "ociVersion": "1.0.2",
        "process": {"terminal": false, "user": {"uid": 0, "gid": 0}, "cwd": "/",
                    "args": ["/bin/sh", "-c", SCRIPT], "env": ["PATH=/bin"]},
        "root": {"path": rootfs, "readonly": true},
        "hostname": "runner-pod",
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}],
            "devices": oci["linux"]["devices"],
            "resources": {"devices": device_rules},
        }
    })
}

/// `kvol pod …` against the agent of `node`.
fn kvol_pod(node: &Node, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvol"))
        .arg("pod")
        .args(args)
        .arg("--state-dir")
        .arg(&node.root)
        .output()
        .unwrap()
}

#[test]
fn a_runner_runs_a_real_container_on_kvols_volumes() {
    let Some((runc, busybox)) = binaries() else { return };
    enter_private_mount_namespace();
    let mut node = Node::new();
    node.write("storage.yaml", STORAGE);
    node.start();
    let socket = node.runtime_socket();
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&socket).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the socket is the owner's only");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut api = runtime
        .block_on(kvol_runtime_api::connect_within(&socket, std::time::Duration::from_secs(30), || {}))
        .unwrap();

    // Handed over, waited for.
    let uid = runtime
        .block_on(api.admit_pod(AdmitPodRequest { pod_json: POD.as_bytes().to_vec() }))
        .unwrap()
        .into_inner()
        .pod_uid;
    assert_eq!(uid, UID);
    let again =
        runtime.block_on(api.admit_pod(AdmitPodRequest { pod_json: POD.as_bytes().to_vec() })).unwrap_err();
    assert_eq!(again.code(), tonic::Code::AlreadyExists, "{again:?}");
    let asked = Instant::now();
    let ready = runtime
        .block_on(api.wait_for_volumes(WaitRequest { pod_uid: uid.clone(), timeout_ms: 60_000 }))
        .unwrap()
        .into_inner();
    assert!(ready.ready, "{ready:#?}\n{}", node.agent_log());
    eprintln!("the pod's four volumes were ready {:?} after the pod was handed over", asked.elapsed());

    // The container's mounts, from the CLI as a runner script would take them.
    let out = kvol_pod(&node, &["mounts", &uid, "main", "--format", "oci"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let oci: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cri = runtime
        .block_on(
            api.container_mounts(ContainerMountsRequest { pod_uid: uid.clone(), container: "main".into() }),
        )
        .unwrap()
        .into_inner();
    let sub = cri.mounts.iter().find(|m| m.container_path == "/etc/app.conf").expect("the subPath mount");
    assert!(sub.host_path.contains("/volume-subpaths/cfg/main/2"), "{sub:?}");
    assert!(sub.readonly, "a configMap is read-only");

    // Run it.
    let scratch = kvol_test_support::ScratchRoot::new();
    let bundle = scratch.path().to_path_buf();
    let root = rootfs(&bundle, &busybox);
    std::fs::write(bundle.join("config.json"), serde_json::to_vec_pretty(&config(&root, &oci)).unwrap())
        .unwrap();
    let run = Command::new(&runc)
        .args(["--root"])
        .arg(bundle.join("runc-state"))
        .args(["run", "--bundle"])
        .arg(&bundle)
        .arg("kvol-runner-e2e")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(run.status.success(), "runc: {}\n{said}", String::from_utf8_lossy(&run.stderr));
    eprintln!("the container said:\n{said}");
    for want in [
        "data=ok",
        "scratch=ok",
        "conf=greeting=hello from a configmap",
        "ro=/bin/sh: can't create /data-ro/nope: Read-only file system",
        "cfg=/bin/sh: can't create /etc/cfg/nope: Read-only file system",
        "block=device",
        "cfg-files=app.conf other",
    ] {
        assert!(said.lines().any(|l| l.trim_end() == want), "missing {want:?} in:\n{said}");
    }
    let published = |volume: &str| ready.volumes.iter().find(|v| v.name == volume).unwrap().host_path.clone();
    assert_eq!(
        std::fs::read_to_string(Path::new(&published("data")).join("out")).unwrap(),
        "written-by-the-container\n"
    );
    assert_eq!(
        std::fs::read_to_string(Path::new(&published("scratch")).join("runner-pod/out")).unwrap(),
        "scratch\n"
    );

    // Taken back; the wait for the teardown returns once nothing is left.
    runtime.block_on(api.release_pod(ReleasePodRequest { pod_uid: uid.clone() })).unwrap();
    let gone = runtime
        .block_on(api.wait_for_volumes_gone(WaitRequest { pod_uid: uid.clone(), timeout_ms: 60_000 }))
        .unwrap()
        .into_inner();
    assert!(gone.ready, "{gone:#?}\n{}", node.agent_log());
    let left: Vec<_> =
        node.mounts().into_iter().filter(|m| m.target.starts_with(node.root.join("kubelet/pods"))).collect();
    assert!(left.is_empty(), "left mounted: {left:#?}");
    let unknown = runtime.block_on(api.release_pod(ReleasePodRequest { pod_uid: uid.clone() })).unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
}
