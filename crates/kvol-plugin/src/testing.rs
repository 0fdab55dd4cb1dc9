//! Test doubles behind the plugin seams, for this crate's tests and benchmarks and for later crates.
