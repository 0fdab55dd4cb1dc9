//! The Containerfiles in `deploy/` stay buildable as the workspace moves (no container tool runs in CI): Rust at least the workspace's `rust-version`, every copied path present, and the installer image taking kvol from where kvol's image puts it.

use std::path::Path;

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(REPO).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `1.90` → (1, 90).
fn version(text: &str) -> (u32, u32) {
    let mut parts = text.trim().trim_matches('"').split('.').map(|p| p.parse::<u32>().unwrap());
    (parts.next().unwrap(), parts.next().unwrap())
}

/// The value of `ARG name=value` in a Containerfile.
fn arg(containerfile: &str, name: &str) -> Option<String> {
    containerfile.lines().find_map(|l| l.strip_prefix(&format!("ARG {name}=")).map(str::to_string))
}

#[test]
fn kvols_image_builds_with_the_workspaces_rust_from_paths_that_exist() {
    let containerfile = read("deploy/kvol/Containerfile");
    let cargo = read("Cargo.toml");
    let wanted = cargo.lines().find_map(|l| l.strip_prefix("rust-version = ")).expect("rust-version");
    let pinned = arg(&containerfile, "RUST_VERSION").expect("ARG RUST_VERSION");
    assert!(
        version(&pinned) >= version(wanted),
        "the image pins Rust {pinned}, the workspace needs {wanted}"
    );
    for line in containerfile.lines().filter(|l| l.starts_with("COPY ") && !l.contains("--from")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        for source in &words[1..words.len() - 1] {
            assert!(Path::new(REPO).join(source).exists(), "{line}: {source} is not in the repository");
        }
    }
    assert!(containerfile.contains("cargo build --release --locked -p kvol"), "{containerfile}");
    assert!(containerfile.contains("COPY --from=build /src/target/release/kvol /usr/local/bin/kvol"));
}

#[test]
fn kvols_image_builds_with_the_rust_that_made_the_code_layout_list() {
    // Symbol hashes depend on the compiler: with another one, no name in the list matches and
    // the image's agent runs with its code scattered (about 5 MiB more resident).
    let list = read("crates/kvol/link/hot-text.txt");
    let made_by = list
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("# rustc version "))
        .and_then(|l| l.split(':').next())
        .expect("hot-text.txt starts with the rustc version that made it");
    let pinned = arg(&read("deploy/kvol/Containerfile"), "RUST_VERSION").expect("ARG RUST_VERSION");
    assert_eq!(pinned, made_by, "kvol's image pins Rust {pinned}; link/hot-text.txt was made with {made_by}");
}

#[test]
fn the_flexvolume_installer_takes_kvol_from_kvols_image() {
    let installer = read("deploy/flexvolume/Containerfile");
    assert!(installer.contains("FROM ${KVOL_IMAGE} AS kvol"), "{installer}");
    assert!(installer.contains("COPY --from=kvol /usr/local/bin/kvol /usr/local/bin/kvol"), "{installer}");
    let driver = arg(&installer, "DRIVER_FILE").expect("ARG DRIVER_FILE");
    assert!(Path::new(REPO).join(&driver).is_file(), "the default driver {driver} is not in the repository");
}
