//! imagePullSecrets against a real registry: Debian's `docker-registry` (the distribution registry) with htpasswd authentication on loopback, the example image pushed to it with `ctr`; a pod whose pull secret has the credentials runs it, one without a secret and one whose secret has a wrong password wait in ErrImagePull/ImagePullBackOff with the registry's 401, and nothing else is held up.
//!
//! Needs root, containerd, runc, a static busybox, `docker-registry` and `htpasswd`
//! (apt-get install docker-registry apache2-utils); skipped, saying which, without them.

#[allow(dead_code)]
mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::containerd::{Containerd, IMAGE, main_container, tools, wait_pod};
use support::kubelet_host::free_port;
use support::{Daemon, Node, enter_private_mount_namespace};

const PRIVATE_UID: &str = "3c9a0000-0000-4000-8000-0000000000a1";
const ANONYMOUS_UID: &str = "3c9a0000-0000-4000-8000-0000000000a2";
const WRONG_UID: &str = "3c9a0000-0000-4000-8000-0000000000a3";

/// Whether `tool` is on PATH.
fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

fn run(command: &mut Command) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(out.status.success(), "{command:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The registry on `127.0.0.1:port`, its users those of an htpasswd file with `user`.
fn registry(dir: &Path, port: u16, (user, password): (&str, &str)) -> Daemon {
    let htpasswd = run(Command::new("htpasswd").args(["-Bbn", user, password]));
    std::fs::write(dir.join("htpasswd"), htpasswd).unwrap();
    let config = format!(
        "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {data}\nhttp:\n  addr: 127.0.0.1:{port}\nauth:\n  htpasswd:\n    realm: kvol-registry\n    path: {htpasswd}\n",
        data = dir.join("data").display(),
        htpasswd = dir.join("htpasswd").display(),
    );
    std::fs::write(dir.join("config.yml"), config).unwrap();
    let mut command = Command::new("docker-registry");
    command.arg("serve").arg(dir.join("config.yml"));
    let daemon = Daemon::spawn("docker-registry", command, &dir.join("registry.log"));
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed() < Duration::from_secs(30), "the registry never listened on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    daemon
}

/// A pull secret for `registry` with `user:password`, as a manifest.
fn pull_secret(name: &str, registry: &str, user: &str, password: &str) -> String {
    let config = serde_json::json!({"auths": {registry: {"username": user, "password": password}}});
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: default}}\ntype: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: '{config}'\n"
    )
}

/// A pod of `image` (pulled every time), with the pull secret `secret` if any.
fn pod(name: &str, uid: &str, image: &str, secret: Option<&str>) -> String {
    let secrets = secret.map(|s| format!("\n  imagePullSecrets: [{{name: {s}}}]")).unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, uid: {uid}}}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 0{secrets}\n  containers:\n  - {{name: main, image: '{image}', imagePullPolicy: Always, command: [sleep, '100000']}}\n"
    )
}

#[test]
fn a_pull_secret_opens_a_private_registry_and_its_absence_is_said() {
    let busybox = match tools() {
        Ok(busybox) => busybox,
        Err(why) => return eprintln!("skipped: {why}"),
    };
    if let Some(missing) = ["docker-registry", "htpasswd"].into_iter().find(|t| !on_path(t)) {
        return eprintln!(
            "skipped: {missing} is not on PATH (apt-get install docker-registry apache2-utils)"
        );
    }
    enter_private_mount_namespace();
    let containerd = Containerd::with_image(&busybox);
    let scratch = kvol_test_support::ScratchRoot::new();
    let port = free_port();
    let _registry = registry(scratch.path(), port, ("kvoluser", "kvolpass"));
    let location = format!("127.0.0.1:{port}");
    let private = format!("{location}/kvol/busybox:1");
    containerd.ctr(&["images", "tag", IMAGE, &private]).expect("tagged");
    containerd
        .ctr(&["images", "push", "--plain-http", "--user", "kvoluser:kvolpass", &private])
        .expect("pushed to the registry");
    // Only the registry has it under that name now: a pod's image must be pulled from there.
    containerd.ctr(&["images", "rm", &private]).expect("the local name removed");

    let mut node = Node::new();
    node.agent_args =
        vec!["--container-runtime-endpoint".into(), containerd.endpoint(), "--no-components".into()];
    node.start();
    node.runtime_socket();
    node.write("regcred.yaml", &pull_secret("regcred", &location, "kvoluser", "kvolpass"));
    node.write("wrongcred.yaml", &pull_secret("wrongcred", &location, "kvoluser", "guess"));
    let written = Instant::now();
    node.write("private.yaml", &pod("private", PRIVATE_UID, &private, Some("regcred")));
    node.write("anonymous.yaml", &pod("anonymous", ANONYMOUS_UID, &private, None));
    node.write("wrong.yaml", &pod("wrong", WRONG_UID, &private, Some("wrongcred")));

    let running = wait_pod(&node, PRIVATE_UID, Duration::from_secs(60), "private running", |s| {
        main_container(s)["state"] == "running"
    });
    eprintln!(
        "private: pulled with its secret and running {} ms after the manifests",
        written.elapsed().as_millis()
    );
    assert_eq!(running["phase"], "Running", "{running:#}");
    for (uid, name) in [(ANONYMOUS_UID, "anonymous"), (WRONG_UID, "wrong")] {
        let refused = wait_pod(&node, uid, Duration::from_secs(60), name, |s| {
            let reason = &main_container(s)["reason"];
            reason == "ErrImagePull" || reason == "ImagePullBackOff"
        });
        assert_eq!(refused["phase"], "Pending", "{name}: {refused:#}");
        // The pull's error (kubelet's Failed Event and ErrImagePull message) carries the
        // registry's answer; the back-off's message is kubelet's "Back-off pulling image".
        let log = node.agent_log();
        let failed = log
            .lines()
            .find(|l| l.contains("image pull failed") && l.contains(&format!("pod=default/{name} ")))
            .unwrap_or_else(|| panic!("{name}: no pull failure in the log:\n{log}"));
        assert!(failed.contains("401 Unauthorized"), "{name}: {failed}");
        eprintln!("{name}: {}, the log says: {failed}", main_container(&refused)["reason"]);
    }
}
