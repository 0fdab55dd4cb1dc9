//! The pod runner on a real containerd: a private containerd (Debian's, with runc) under a scratch directory, a busybox image built here from the host's static busybox, and the real `kvol agent --container-runtime-endpoint` — a pod reads a ConfigMap (a file, a subPath, an env) and writes an emptyDir, a missing image and a missing key are kubelet's reasons, a pod that ends under `Never` succeeds with its termination message, a crashing container is restarted with kubelet's back-off, a readiness probe turns true and a failed liveness probe restarts, a kill -9 of the agent restarts nothing (and the next agent removes what was dropped meanwhile), and a removed pod gets SIGTERM before nothing of it is left in containerd and no mount.
//!
//! Needs root, `containerd`, `ctr`, `runc` on PATH and a static `/bin/busybox` (Debian's
//! `containerd runc busybox-static`); skipped, saying so, without them.

#[allow(dead_code)]
mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use support::containerd::{Containerd, IMAGE, main_container, pod_status, tools, wait_pod};
use support::{Node, enter_private_mount_namespace, wait_for_path};

const WEB_UID: &str = "3c9a0000-0000-4000-8000-00000000e2e1";
const CRASH_UID: &str = "3c9a0000-0000-4000-8000-00000000e2e2";
const BAD_IMAGE_UID: &str = "3c9a0000-0000-4000-8000-00000000e2e3";
const BAD_ENV_UID: &str = "3c9a0000-0000-4000-8000-00000000e2e4";
const DONE_UID: &str = "3c9a0000-0000-4000-8000-00000000e2e5";
const PROBED_UID: &str = "3c9a0000-0000-4000-8000-00000000e2e6";

/// Ready 2 s after it starts (its readiness probe finds /tmp/ready); unhealthy 5 s after (its
/// liveness probe stops finding /tmp/alive), so restarted.
const PROBED: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: probed, namespace: default, uid: 3c9a0000-0000-4000-8000-00000000e2e6}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: IMAGE
    command: [sh, -c, "touch /tmp/alive; sleep 2; touch /tmp/ready; sleep 3; rm /tmp/alive; sleep 1000"]
    readinessProbe:
      exec: {command: [cat, /tmp/ready]}
      periodSeconds: 1
    livenessProbe:
      exec: {command: [cat, /tmp/alive]}
      periodSeconds: 1
      failureThreshold: 2
"#;

fn manifests(marker_dir: &Path) -> (String, String, String) {
    let config_map = r#"apiVersion: v1
kind: ConfigMap
metadata: {name: app, namespace: default}
data: {app.conf: "colour=blue", greeting: "hello from a configmap"}
"#;
    let web = format!(
        r#"{config_map}---
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: default, uid: {WEB_UID}}}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 10
  containers:
  - name: main
    image: {IMAGE}
    command: [sh, -c]
    args:
    - |
      trap 'echo "TERM at $(date +%s)" > /marker/term; exit 0' TERM
      echo "env=$GREETING"
      echo "file=$(cat /cfg/app.conf)"
      echo "subpath=$(cat /etc/app.conf)"
      echo "$(cat /etc/app.conf) written by the container" > /scratch/seen
      echo started > /marker/started
      while true; do sleep 1; done
    env:
    - name: GREETING
      valueFrom: {{configMapKeyRef: {{name: app, key: greeting}}}}
    volumeMounts:
    - {{name: cfg, mountPath: /cfg}}
    - {{name: cfg, mountPath: /etc/app.conf, subPath: app.conf}}
    - {{name: scratch, mountPath: /scratch}}
    - {{name: marker, mountPath: /marker}}
  volumes:
  - {{name: cfg, configMap: {{name: app}}}}
  - {{name: scratch, emptyDir: {{}}}}
  - {{name: marker, hostPath: {{path: {marker}, type: DirectoryOrCreate}}}}
"#,
        marker = marker_dir.display()
    );
    let crash = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: crash, namespace: default, uid: {CRASH_UID}}}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: {IMAGE}
    command: [sh, -c, "echo crashing; exit 1"]
"#
    );
    let bad = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: bad-image, namespace: default, uid: {BAD_IMAGE_UID}}}
spec:
  hostNetwork: true
  containers:
  - {{name: main, image: "127.0.0.1:1/kvol/absent:1"}}
---
apiVersion: v1
kind: Pod
metadata: {{name: bad-env, namespace: default, uid: {BAD_ENV_UID}}}
spec:
  hostNetwork: true
  containers:
  - name: main
    image: {IMAGE}
    env:
    - name: X
      valueFrom: {{configMapKeyRef: {{name: app, key: nope}}}}
"#
    );
    let done = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: done, namespace: default, uid: {DONE_UID}}}
spec:
  hostNetwork: true
  restartPolicy: Never
  containers:
  - name: main
    image: {IMAGE}
    command: [sh, -c, "echo -n 'all done' > /dev/termination-log"]
"#
    );
    (web, crash, format!("{bad}---\n{done}"))
}

#[test]
fn pods_run_on_a_real_containerd() {
    let busybox = match tools() {
        Ok(busybox) => busybox,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    enter_private_mount_namespace();
    // Dropped last: the agent is killed (Node's drop) before containerd's tasks are.
    let containerd = Containerd::with_image(&busybox);

    let mut node = Node::new();
    node.agent_args =
        vec!["--container-runtime-endpoint".into(), containerd.endpoint(), "--no-components".into()];
    node.start();
    node.runtime_socket();
    let marker = node.root.join("marker");
    let (web, crash, bad) = manifests(&marker);

    // Manifest → container running.
    let written = Instant::now();
    node.write("web.yaml", &web);
    let running = wait_pod(&node, WEB_UID, Duration::from_secs(60), "web running", |s| {
        main_container(s)["state"] == "running"
    });
    let to_running = written.elapsed();
    eprintln!("web: manifest written → container running in {} ms", to_running.as_millis());
    let web_lines: Vec<String> = node
        .agent_log()
        .lines()
        .filter(|l| l.contains(WEB_UID) || l.contains("pod=default/web"))
        .map(|l| l.chars().take(160).collect())
        .collect();
    eprintln!("the agent's lines of it:\n{}", web_lines.join("\n"));
    assert_eq!(running["phase"], "Running", "{running:#}");
    assert_eq!(running["ready"], true, "{running:#}");
    let web_id = main_container(&running)["containerId"].as_str().unwrap().to_string();
    wait_for_path(&marker.join("started"), "the container's start marker", Duration::from_secs(10));

    // What it saw, from its log in kubelet's layout, and what it wrote, on the host.
    let log = node.root.join(format!("logs/pods/default_web_{WEB_UID}/main/0.log"));
    let start = Instant::now();
    let said = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("subpath=") || start.elapsed() > Duration::from_secs(10) {
            break text;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("web's log:\n{said}");
    for want in
        ["stdout F env=hello from a configmap", "stdout F file=colour=blue", "stdout F subpath=colour=blue"]
    {
        assert!(said.lines().any(|l| l.ends_with(want)), "missing {want:?} in {}:\n{said}", log.display());
    }
    let seen = node.root.join(format!("kubelet/pods/{WEB_UID}/volumes/kubernetes.io~empty-dir/scratch/seen"));
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "colour=blue written by the container\n");

    // `kvol pod logs` prints it without the CRI prefixes.
    let out = Command::new(env!("CARGO_BIN_EXE_kvol"))
        .args(["pod", "logs", "default/web", "--root"])
        .arg(&node.root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "env=hello from a configmap\nfile=colour=blue\nsubpath=colour=blue\n",
        "kvol pod logs"
    );

    // `kvol status` shows it as kubelet's PodStatus does.
    let out = Command::new(env!("CARGO_BIN_EXE_kvol"))
        .args(["status", "-o", "json", "--root"])
        .arg(&node.root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let shown =
        status["pods"].as_array().unwrap().iter().find(|p| p["pod"] == "default/web").cloned().unwrap();
    assert_eq!(
        (shown["phase"].as_str(), shown["ready"].as_bool()),
        (Some("Running"), Some(true)),
        "{shown:#}"
    );
    assert_eq!(main_container(&shown)["state"], "running");

    // Bad input: each a kubelet reason in its pod's status, nothing else affected.
    node.write("bad.yaml", &bad);
    // ErrImagePull, then ImagePullBackOff until the back-off's 10 s pass, then a pull again.
    wait_pod(&node, BAD_IMAGE_UID, Duration::from_secs(30), "image pull back-off", |s| {
        main_container(s)["reason"] == "ImagePullBackOff" && s["phase"] == "Pending"
    });
    let backing_off = Instant::now();
    let pulled = wait_pod(&node, BAD_IMAGE_UID, Duration::from_secs(30), "image pulled again", |s| {
        main_container(s)["reason"] == "ErrImagePull"
    });
    eprintln!(
        "bad-image: pulled again {} ms after ImagePullBackOff was seen",
        backing_off.elapsed().as_millis()
    );
    assert!(
        main_container(&pulled)["message"].as_str().unwrap().contains("127.0.0.1:1/kvol/absent:1"),
        "{pulled:#}"
    );
    let config_error = wait_pod(&node, BAD_ENV_UID, Duration::from_secs(30), "config error", |s| {
        main_container(s)["reason"] == "CreateContainerConfigError"
    });
    assert_eq!(main_container(&config_error)["message"], "couldn't find key nope in ConfigMap default/app");
    assert_eq!(config_error["phase"], "Pending");
    // A pod that ran to its end under Never: Succeeded, its termination message read back.
    let done = wait_pod(&node, DONE_UID, Duration::from_secs(30), "done", |s| s["phase"] == "Succeeded");
    assert_eq!(main_container(&done)["state"], "terminated", "{done:#}");
    assert_eq!(main_container(&done)["reason"], "Completed", "{done:#}");
    assert_eq!(main_container(&done)["exitCode"], 0, "{done:#}");
    assert_eq!(main_container(&done)["message"], "all done", "{done:#}");
    let web_now = pod_status(&node, WEB_UID).unwrap();
    assert_eq!(main_container(&web_now)["containerId"], web_id.as_str(), "web untouched: {web_now:#}");
    node.remove("bad.yaml");

    // A crashing container: restarted at once, then after kubelet's 10 s back-off.
    node.write("crash.yaml", &crash);
    let looping = wait_pod(&node, CRASH_UID, Duration::from_secs(30), "crash loop", |s| {
        main_container(s)["reason"] == "CrashLoopBackOff"
            && main_container(s)["restartCount"].as_u64() >= Some(1)
    });
    let backing_off = Instant::now();
    eprintln!("crash: {:#}", main_container(&looping));
    assert_eq!(looping["phase"], "Running", "Always restarts: kubelet's phase stays Running");
    assert!(
        main_container(&looping)["message"]
            .as_str()
            .unwrap()
            .starts_with("back-off 10s restarting failed container=main pod=crash_default(")
    );
    let restarted = wait_pod(&node, CRASH_UID, Duration::from_secs(30), "second restart", |s| {
        main_container(s)["restartCount"].as_u64() >= Some(2)
    });
    let waited = backing_off.elapsed();
    let out = Command::new(env!("CARGO_BIN_EXE_kvol"))
        .args(["pod", "logs", "crash", "--previous", "-c", "main", "--root"])
        .arg(&node.root)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "crashing\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("crash: restart 2 came {} ms after CrashLoopBackOff was first seen", waited.as_millis());
    assert!(waited >= Duration::from_secs(8), "the back-off was not kept: {waited:?} {restarted:#}");

    // Probes: not ready, then ready once its readiness probe passes; restarted once its
    // liveness probe fails twice.
    let probed_at = Instant::now();
    node.write("probed.yaml", &PROBED.replace("IMAGE", IMAGE));
    let unready = wait_pod(&node, PROBED_UID, Duration::from_secs(30), "probed running", |s| {
        main_container(s)["state"] == "running"
    });
    assert_eq!(
        (unready["ready"].as_bool(), main_container(&unready)["ready"].as_bool()),
        (Some(false), Some(false)),
        "{unready:#}"
    );
    wait_pod(&node, PROBED_UID, Duration::from_secs(30), "probed ready", |s| s["ready"] == true);
    let ready_after = probed_at.elapsed();
    let restarted = wait_pod(&node, PROBED_UID, Duration::from_secs(30), "probed restarted", |s| {
        main_container(s)["restartCount"] == 1 && main_container(s)["state"] == "running"
    });
    eprintln!(
        "probed: ready {} ms after its manifest, restarted by its liveness probe {} ms after it: {restarted:#}",
        ready_after.as_millis(),
        probed_at.elapsed().as_millis()
    );
    assert!(probed_at.elapsed() >= Duration::from_secs(5), "restarted before its liveness probe could fail");
    node.remove("probed.yaml");

    // kill -9 of the agent: the running container is adopted, not restarted; the crash pod,
    // removed while no agent ran, and the probed pod, whose removal the kill cut short, are
    // stopped and removed by the next agent.
    node.kill_9();
    node.remove("crash.yaml");
    // The status file is rewritten by the next agent's runner; the old one must not answer.
    std::fs::remove_file(node.root.join("runner/pods.json")).unwrap();
    let restarted_at = Instant::now();
    node.start();
    let after = wait_pod(&node, WEB_UID, Duration::from_secs(30), "web adopted", |s| {
        main_container(s)["state"] == "running"
    });
    eprintln!("web adopted {} ms after the agent's restart", restarted_at.elapsed().as_millis());
    assert_eq!(main_container(&after)["containerId"], web_id.as_str(), "the same container runs: {after:#}");
    assert_eq!(main_container(&after)["restartCount"], 0, "{after:#}");
    let start = Instant::now();
    while pod_status(&node, CRASH_UID).is_some()
        || pod_status(&node, PROBED_UID).is_some()
        || containerd.containers().len() != 2
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the pods no longer wanted were not removed: {:?}\n{}",
            containerd.containers(),
            node.agent_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let containers = containerd.containers();
    assert!(containers.contains(&web_id), "web's sandbox and container are all that is left: {containers:?}");
    assert!(containerd.tasks().contains(&web_id), "its task still runs");
    std::thread::sleep(Duration::from_secs(2));
    let still = pod_status(&node, WEB_UID).unwrap();
    assert_eq!(
        main_container(&still)["containerId"],
        web_id.as_str(),
        "nothing restarted it since: {still:#}"
    );

    // Removed: SIGTERM reaches it, then nothing of it is left.
    let removed = Instant::now();
    node.remove("web.yaml");
    let start = Instant::now();
    let uids = [WEB_UID, CRASH_UID, BAD_IMAGE_UID, BAD_ENV_UID, DONE_UID, PROBED_UID];
    while uids.iter().any(|uid| pod_status(&node, uid).is_some()) {
        assert!(start.elapsed() < Duration::from_secs(60), "pods never went\n{}", node.agent_log());
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "every pod removed (containers stopped, sandboxes removed, volumes gone) in {} ms",
        removed.elapsed().as_millis()
    );
    let term = std::fs::read_to_string(marker.join("term")).expect("the TERM trap wrote its marker");
    assert!(term.starts_with("TERM at "), "{term}");
    assert_eq!(containerd.containers(), Vec::<String>::new(), "containers left in containerd");
    assert_eq!(containerd.tasks(), Vec::<String>::new(), "tasks left in containerd");
    let left: Vec<_> =
        node.mounts().into_iter().filter(|m| m.target.starts_with(node.root.join("kubelet/pods"))).collect();
    assert!(left.is_empty(), "left mounted: {left:#?}");
}
