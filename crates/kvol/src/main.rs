//! The kvol binary: parses the command line and hands it to the `kvol` library.
use clap::Parser;

// Translation is allocation-bound (many small strings); mimalloc makes a PV deep copy ~1.5x
// cheaper than the system allocator in `cargo bench -p kvol-translate`. Without the `mimalloc`
// feature (on by default) the system allocator serves: heaptrack and massif see only its
// calls. With it the agent holds ~3.5 MiB more at 100 volumes, without it a 50-pod burst
// publishes ~10% slower (`cargo bench -p kvol --bench agent`).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = kvol::Cli::parse();
    // Logs go to stderr; `KVOL_LOG` (tracing's filter syntax, e.g. `info` or
    // `kvol_csi=debug`) chooses what, and long-running commands default to `info`.
    let default = if cli.command.is_long_running() { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("KVOL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).init();
    // A component the agent supervises ends with the agent (a no-op for anyone else).
    kvol_components_runtime::supervisor::follow_parent();
    kvol::run(cli)
}
