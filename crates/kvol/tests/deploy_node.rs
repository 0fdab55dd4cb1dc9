//! deploy/node/kvol.service, the node agent's systemd unit, keeps its promises: every flag of its `ExecStart` is one `kvol agent` takes (the TLS bootstrap's among them), it runs after containerd, and it restarts.

use std::process::Command;

fn unit() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/node/kvol.service"))
        .expect("deploy/node/kvol.service")
}

fn setting<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    unit.lines().filter_map(|l| l.strip_prefix(key)?.strip_prefix('=')).collect()
}

#[test]
fn its_command_is_one_kvol_takes() {
    let unit = unit();
    let exec = setting(&unit, "ExecStart");
    assert_eq!(exec.len(), 1, "one ExecStart");
    let words: Vec<&str> = exec[0].split_whitespace().collect();
    assert_eq!(&words[..2], ["/usr/local/bin/kvol", "agent"]);
    let joins = ["--kubeconfig", "--bootstrap-kubeconfig", "--cert-dir", "--rotate-certificates"];
    for flag in joins.into_iter().chain(["--container-runtime-endpoint", "--client-ca-file"]) {
        assert!(words.contains(&flag), "{flag} in {words:?}");
    }
    // Each flag by itself is one `kvol agent --help` lists.
    let help = Command::new(env!("CARGO_BIN_EXE_kvol")).args(["agent", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in words.iter().filter(|w| w.starts_with("--")) {
        assert!(
            help.contains(&format!("  {flag} ")) || help.contains(&format!("  {flag}\n")),
            "{flag} not in kvol agent --help"
        );
    }
    assert!(!help.contains("  --no-such-flag "), "the check finds what is not there");
    // The flags parse (clap stops at an unknown one before --help).
    let out = Command::new(env!("CARGO_BIN_EXE_kvol")).args(&words[1..]).arg("--help").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bad = Command::new(env!("CARGO_BIN_EXE_kvol"))
        .args(["agent", "--no-such-flag", "--help"])
        .output()
        .unwrap();
    assert!(!bad.status.success(), "an unknown flag is refused even before --help");
}

#[test]
fn it_runs_after_containerd_and_restarts() {
    let unit = unit();
    assert!(setting(&unit, "After").iter().any(|v| v.contains("containerd.service")));
    assert_eq!(setting(&unit, "Restart"), ["always"]);
    assert_eq!(setting(&unit, "WantedBy"), ["multi-user.target"]);
}
