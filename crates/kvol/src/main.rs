//! The kvol binary: parses the command line and hands it to the `kvol` library.
use clap::Parser;

fn main() -> std::process::ExitCode {
    kvol::run(kvol::Cli::parse())
}
