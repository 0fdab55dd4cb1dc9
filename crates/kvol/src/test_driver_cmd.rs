//! `kvol test-driver`: runs the node half of the external storage e2e suites against a CSI driver from its test-driver YAML, prints the table, writes JUnit XML, and fails when a case failed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use kvol_test_driver::report;
use kvol_test_driver::{Config, DriverSpec};

#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("driver").required(true).args(["driver_socket", "driver_command"])))]
pub struct TestDriverArgs {
    /// The driver definition: the YAML (or JSON) file given to `e2e.test -storage.testdriver`.
    #[arg(long)]
    pub driver_definition: PathBuf,
    /// The CSI socket of a driver already running on this node.
    #[arg(long)]
    pub driver_socket: Option<PathBuf>,
    /// A command line that runs the driver, `{socket}` where its CSI endpoint goes; kvol
    /// starts it, restarts it for the disruptive case, and stops it at the end.
    #[arg(long)]
    pub driver_command: Option<String>,
    /// Write the report as JUnit XML to this file.
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Run only the cases whose name (or upstream name) contains one of these
    /// (comma-separated, or the flag repeated).
    #[arg(long, value_delimiter = ',')]
    pub focus: Vec<String>,
    /// Where kubelet's directories, the driver's socket and log go (a run directory is made
    /// in it and removed at the end).
    #[arg(long, default_value = "/var/lib/kvol-test-driver")]
    pub work_dir: PathBuf,
    /// Each CSI call's deadline, in seconds.
    #[arg(long, default_value_t = 60)]
    pub call_timeout: u64,
    /// runc, to run the containers of the cases that need one (with --busybox).
    #[arg(long, env = "KVOL_RUNC", requires = "busybox")]
    pub runc: Option<PathBuf>,
    /// A static busybox, the containers' root (with --runc).
    #[arg(long, env = "KVOL_BUSYBOX", requires = "runc")]
    pub busybox: Option<PathBuf>,
    /// Also list each skipped case's reason after the table.
    #[arg(long)]
    pub show_skipped: bool,
}

/// Runs the cases; exit status 0 when none failed, 1 when one did.
pub fn run(args: &TestDriverArgs) -> anyhow::Result<ExitCode> {
    let driver = match (&args.driver_socket, &args.driver_command) {
        (Some(socket), _) => DriverSpec::Socket(socket.clone()),
        (None, Some(command)) => DriverSpec::Command(command.clone()),
        (None, None) => anyhow::bail!("give --driver-socket or --driver-command"),
    };
    let config = Config {
        definition_file: args.driver_definition.clone(),
        driver,
        work_dir: args.work_dir.clone(),
        focus: args.focus.clone(),
        call_timeout: Duration::from_secs(args.call_timeout),
        containers: args.runc.clone().zip(args.busybox.clone()),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let outcome = runtime.block_on(kvol_test_driver::run(&config))?;
    for warning in &outcome.warnings {
        eprintln!("kvol: test-driver: {warning}");
    }
    print!("{}", report::table(&outcome.driver, &outcome.results, outcome.total));
    if args.show_skipped {
        print!("{}", report::skip_reasons(&outcome.results));
    }
    if let Some(path) = &args.junit {
        let xml = report::junit(&outcome.driver, &outcome.results, outcome.total);
        std::fs::write(path, xml)
            .with_context(|| format!("cannot write the junit report {}", path.display()))?;
    }
    let totals = report::totals(&outcome.results);
    Ok(if totals.failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
