//! The pure decision crates stay reachable without the mount, exec or gRPC stacks: their normal dependency graphs hold none of them.

use std::process::Command;

/// Crates that would bring a runtime, syscalls or gRPC into a control-plane tool.
const IO_STACKS: &[&str] = &["tokio", "nix", "rustix", "tonic", "prost", "hyper", "mio", "notify", "kube"];

/// The crates whose decisions a control-plane tool uses: CSI's rules, migration, the shared
/// vocabulary, the components' decisions, and the standalone control plane's decisions (its
/// runner is a default feature, left out here), with the `cargo tree` flags that select them.
const PURE_CRATES: &[(&str, &[&str])] = &[
    ("kvol-csi-rules", &[]),
    ("kvol-translate", &[]),
    ("kvol-api", &[]),
    ("kvol-components", &[]),
    ("kvol-claims", &["--no-default-features"]),
];

fn normal_dependencies(package: &str, flags: &[&str]) -> Vec<String> {
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none", "--format", "{p}", "-p", package])
        .args(flags)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(output.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).expect("cargo tree prints utf-8");
    text.lines().filter_map(|line| line.split_whitespace().next()).map(str::to_string).collect()
}

#[test]
fn pure_crates_depend_on_no_io_stack() {
    for (package, flags) in PURE_CRATES {
        let deps = normal_dependencies(package, flags);
        assert!(
            deps.iter().any(|d| d == package),
            "cargo tree -p {package} did not list {package}: {deps:?}"
        );
        let found: Vec<&String> = deps.iter().filter(|d| IO_STACKS.contains(&d.as_str())).collect();
        assert!(found.is_empty(), "{package} depends on {found:?}, which a control-plane tool must not need");
    }
}

#[test]
fn the_check_sees_an_io_stack_where_there_is_one() {
    // kvol-csi is the gRPC layer, and kvol-claims with its runner calls it: if this fails to
    // find tokio, the check above proves nothing (nor does the feature that leaves it out).
    for package in ["kvol-csi", "kvol-claims"] {
        let deps = normal_dependencies(package, &[]);
        for stack in ["tokio", "nix", "tonic"] {
            assert!(deps.iter().any(|d| d == stack), "cargo tree -p {package} lists no {stack}: {deps:?}");
        }
    }
}
