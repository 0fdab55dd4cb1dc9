//! Every kind of volume kvol serves, read and written by real containers on a real containerd (Debian's, with runc; the image built here from the host's static busybox), through the real `kvol agent --container-runtime-endpoint` with its bundled CSI driver: a claim, an emptyDir, a configMap through a subPath, a secret, the downward API, a projection, a CSI ephemeral volume and a raw block device; kubelet's `/etc/hosts`; a postStart hook and a preStop hook that write into the claim, then the SIGTERM trap, all before the claim goes; a second pod that reads what the first left in the claim; and a root image under `runAsNonRoot` refused with kubelet's reason; `kvol pod exec` in the running container. Every pod removed → nothing left in containerd and no mount.
//!
//! Needs root, `containerd`, `ctr`, `runc` and a static `/bin/busybox` (Debian's `containerd
//! runc busybox-static`) and loop devices; skipped, saying so, without them.

#[allow(dead_code)]
mod support;

use std::time::{Duration, Instant};

use support::containerd::{Containerd, IMAGE, main_container, pod_status, tools, wait_log, wait_pod};
use support::{Node, enter_private_mount_namespace};

const WRITER_UID: &str = "3c9a0000-0000-4000-8000-0000000001a1";
const READER_UID: &str = "3c9a0000-0000-4000-8000-0000000001a2";
const NON_ROOT_UID: &str = "3c9a0000-0000-4000-8000-0000000001a3";

const STORAGE: &str = r#"apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: kvol-hostpath}
provisioner: hostpath.csi.kvol.io
---
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: hostpath.csi.kvol.io}
spec: {attachRequired: false, podInfoOnMount: true, volumeLifecycleModes: [Persistent, Ephemeral], fsGroupPolicy: File}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default}
spec: {storageClassName: kvol-hostpath, accessModes: [ReadWriteOnce], resources: {requests: {storage: 32Mi}}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: raw, namespace: default}
spec: {storageClassName: kvol-hostpath, volumeMode: Block, accessModes: [ReadWriteOnce], resources: {requests: {storage: 8Mi}}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: app, namespace: default}
data: {app.conf: "colour=blue"}
---
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: default}
stringData: {password: not-a-real-one}
"#;

/// Writes into every volume, prints what it read back, and on its way out leaves, in its
/// claim, what its preStop hook and its SIGTERM trap saw.
fn writer() -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: writer, namespace: default, uid: {WRITER_UID}, labels: {{app: demo}}}}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 10
  containers:
  - name: main
    image: {IMAGE}
    resources: {{limits: {{memory: 64Mi}}}}
    command: [sh, -c]
    args:
    - |
      trap 'echo "TERM after $(cat /data/prestop)" > /data/term; sync; exit 0' TERM
      # The postStart hook runs beside the command, as kubelet runs it: wait for what it writes.
      while [ ! -s /data/poststart ]; do sleep 0.1; done
      echo "poststart=$(cat /data/poststart)"
      echo "secret=$(cat /etc/creds/password)"
      echo "labels=$(cat /etc/downward/labels)"
      echo "memory=$(cat /etc/downward/memory)"
      echo "projected=$(cat /etc/projected/name) $(cat /etc/projected/app.conf) $(cat /etc/projected/password)"
      echo "subpath=$(cat /etc/app.conf)"
      echo "hosts=$(head -n 1 /etc/hosts)"
      echo "written into the claim" > /data/first; echo "claim=$(cat /data/first)"
      echo "scratch" > /ephemeral/x; echo "ephemeral=$(cat /ephemeral/x)"
      echo "empty" > /empty/x; echo "emptydir=$(cat /empty/x)"
      printf 'raw-bytes' | dd of=/dev/xvda bs=512 count=1 conv=sync 2>/dev/null
      echo "block=$(dd if=/dev/xvda bs=9 count=1 2>/dev/null)"
      echo "all read"
      while true; do sleep 1; done
    lifecycle:
      postStart: {{exec: {{command: [sh, -c, "echo ran > /data/poststart"]}}}}
      preStop: {{exec: {{command: [sh, -c, "echo preStop > /data/prestop"]}}}}
    volumeMounts:
    - {{name: data, mountPath: /data}}
    - {{name: creds, mountPath: /etc/creds}}
    - {{name: downward, mountPath: /etc/downward}}
    - {{name: projected, mountPath: /etc/projected}}
    - {{name: config, mountPath: /etc/app.conf, subPath: app.conf}}
    - {{name: ephemeral, mountPath: /ephemeral}}
    - {{name: empty, mountPath: /empty}}
    volumeDevices:
    - {{name: raw, devicePath: /dev/xvda}}
  volumes:
  - {{name: data, persistentVolumeClaim: {{claimName: data}}}}
  - {{name: raw, persistentVolumeClaim: {{claimName: raw}}}}
  - {{name: creds, secret: {{secretName: creds}}}}
  - name: downward
    downwardAPI:
      items:
      - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}
      - {{path: memory, resourceFieldRef: {{containerName: main, resource: limits.memory, divisor: 1Mi}}}}
  - name: projected
    projected:
      sources:
      - configMap: {{name: app}}
      - secret: {{name: creds}}
      - downwardAPI: {{items: [{{path: name, fieldRef: {{fieldPath: metadata.name}}}}]}}
  - {{name: config, configMap: {{name: app}}}}
  - {{name: ephemeral, csi: {{driver: hostpath.csi.kvol.io}}}}
  - {{name: empty, emptyDir: {{}}}}
"#
    )
}

fn reader() -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: reader, namespace: default, uid: {READER_UID}}}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: {IMAGE}
    command: [sh, -c, "cat /data/first /data/poststart /data/prestop /data/term; echo read back; sleep 1000"]
    volumeMounts: [{{name: data, mountPath: /data}}]
  volumes:
  - {{name: data, persistentVolumeClaim: {{claimName: data}}}}
"#
    )
}

fn non_root() -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: non-root, namespace: default, uid: {NON_ROOT_UID}}}
spec:
  hostNetwork: true
  securityContext: {{runAsNonRoot: true}}
  containers:
  - {{name: main, image: {IMAGE}}}
"#
    )
}

#[test]
fn every_volume_kind_reaches_a_real_container() {
    let busybox = match tools() {
        Ok(busybox) => busybox,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    if !std::path::Path::new("/dev/loop-control").exists() {
        eprintln!("skipped: no /dev/loop-control (the block volume needs loop devices)");
        return;
    }
    enter_private_mount_namespace();
    let containerd = Containerd::with_image(&busybox);

    let mut node = Node::new();
    node.agent_args = vec!["--container-runtime-endpoint".into(), containerd.endpoint()];
    node.start();
    node.runtime_socket();
    node.write("00-storage.yaml", STORAGE);
    let written = Instant::now();
    node.write("10-writer.yaml", &writer());
    let writer_pod = ("default", "writer", WRITER_UID);
    let said = wait_log(&node, writer_pod, "main", "all read", Duration::from_secs(90));
    eprintln!("writer ({} ms from its manifest) said:\n{said}", written.elapsed().as_millis());
    let want = [
        "poststart=ran",
        "secret=not-a-real-one",
        "labels=app=\"demo\"",
        "memory=64",
        "projected=writer colour=blue not-a-real-one",
        "subpath=colour=blue",
        "hosts=# Kubernetes-managed hosts file (host network).",
        "claim=written into the claim",
        "ephemeral=scratch",
        "emptydir=empty",
        "block=raw-bytes",
    ];
    for line in want {
        assert!(said.lines().any(|l| l == line), "missing {line:?} in what the writer said:\n{said}");
    }
    let running =
        wait_pod(&node, WRITER_UID, Duration::from_secs(10), "writer ready", |s| s["ready"] == true);
    assert_eq!(main_container(&running)["restartCount"], 0, "{running:#}");

    // `kvol pod exec`: the command's output, and its exit code as kvol's.
    let exec = |command: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kvol"))
            .args(["pod", "exec", "writer", "--root"])
            .arg(&node.root)
            .arg("--")
            .args(command)
            .output()
            .unwrap()
    };
    let out = exec(&["cat", "/data/first"]);
    assert_eq!(
        (out.status.code(), String::from_utf8_lossy(&out.stdout).as_ref()),
        (Some(0), "written into the claim\n"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = exec(&["sh", "-c", "echo oops >&2; exit 3"]);
    assert_eq!((out.status.code(), String::from_utf8_lossy(&out.stderr).as_ref()), (Some(3), "oops\n"));

    // A root image under runAsNonRoot: kubelet's reason, nothing else touched.
    node.write("20-non-root.yaml", &non_root());
    let refused = wait_pod(&node, NON_ROOT_UID, Duration::from_secs(30), "non-root refused", |s| {
        main_container(s)["reason"] == "CreateContainerConfigError"
    });
    assert_eq!(
        main_container(&refused)["message"],
        format!(
            "container has runAsNonRoot and image will run as root (pod: \"non-root_default({NON_ROOT_UID})\", container: main)"
        ),
    );
    node.remove("20-non-root.yaml");

    // Removed: the preStop hook, then SIGTERM, both write into the claim while it is mounted.
    let removing = Instant::now();
    node.remove("10-writer.yaml");
    let start = Instant::now();
    while pod_status(&node, WRITER_UID).is_some() {
        assert!(start.elapsed() < Duration::from_secs(60), "the writer never went\n{}", node.agent_log());
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("writer stopped and its volumes let go in {} ms", removing.elapsed().as_millis());

    // Another pod reads the claim back.
    node.write("30-reader.yaml", &reader());
    let read =
        wait_log(&node, ("default", "reader", READER_UID), "main", "read back", Duration::from_secs(60));
    assert_eq!(
        read, "written into the claim\nran\npreStop\nTERM after preStop\nread back\n",
        "what the reader found"
    );
    node.remove("30-reader.yaml");
    node.remove("00-storage.yaml");

    let start = Instant::now();
    while [WRITER_UID, READER_UID, NON_ROOT_UID].iter().any(|uid| pod_status(&node, uid).is_some())
        || !containerd.containers().is_empty()
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "pods left: {:?}\n{}",
            containerd.containers(),
            node.agent_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(containerd.tasks(), Vec::<String>::new(), "tasks left in containerd");
    let left: Vec<_> =
        node.mounts().into_iter().filter(|m| m.target.starts_with(node.root.join("kubelet/pods"))).collect();
    assert!(left.is_empty(), "left mounted: {left:#?}");
}
