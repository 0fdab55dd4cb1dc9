//! The kvol binary: parses the command line and hands it to the `kvol` library.
use clap::Parser;

// Translation is allocation-bound (many small strings); mimalloc makes a PV deep copy ~1.5x
// cheaper than the system allocator in `cargo bench -p kvol-translate`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    kvol::run(kvol::Cli::parse())
}
