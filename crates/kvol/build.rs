//! Link options for the release binary: the code a node runs placed together, and packed relocations.
//!
//! `link/hot-text.txt` lists the functions (mangled names) that an agent and its bundled driver
//! ran while publishing 100 claims (see `link/README.md`). The linker places them first in
//! `.text`, so the pages the process touches hold little else: scattered, they made ~9 MiB of
//! the 12 MiB of code resident; together, about the size of the code run. A name that no longer
//! exists is skipped, so a stale list costs memory, never correctness.
//! `-z pack-relative-relocs` shrinks the relocations the loader reads at start (600 KB) to a few KB.

fn main() {
    println!("cargo::rerun-if-changed=link/hot-text.txt");
    println!("cargo::rerun-if-env-changed=KVOL_NO_TEXT_ORDER");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let release = var("PROFILE") == "release";
    // x86_64-unknown-linux-gnu links with lld by default (Rust 1.90, the workspace's
    // rust-version); elsewhere the linker may be GNU ld, which has no ordering file.
    let lld_target = var("TARGET") == "x86_64-unknown-linux-gnu";
    let other_linker = var("CARGO_ENCODED_RUSTFLAGS").contains("link");
    if !release || !lld_target || other_linker {
        return;
    }
    println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    if std::env::var_os("KVOL_NO_TEXT_ORDER").is_some() {
        return;
    }
    let order = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"))
        .join("link/hot-text.txt");
    println!("cargo::rustc-link-arg-bins=-Wl,--symbol-ordering-file={}", order.display());
    println!("cargo::rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
}
