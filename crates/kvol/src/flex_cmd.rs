//! `kvol flex install`: installs one Flexvolume driver file atomically into the driver directory.

use std::path::Path;
use std::process::ExitCode;

use kvol_flex::install::install;

/// Installs `driver_file` as `<dir>/<name>/<driver>`; prints what happened. Fails (with the
/// previous version left in place) on any error.
pub fn run_install(driver_file: &Path, name: &str, dir: &Path) -> anyhow::Result<ExitCode> {
    let done = install(driver_file, dir, name)?;
    println!("{}: flexvolume driver {} at {}", done.outcome.as_str(), done.name, done.executable.display());
    Ok(ExitCode::SUCCESS)
}
