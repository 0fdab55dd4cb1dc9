//! `kvol components apply`: the components the config turns on deployed into a cluster from their bundles, what their bundles dropped pruned, the ones turned off left alone.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use kvol_api::StorageSection;
use kvol_components::{Catalogue, bundle, decide_for_cluster};

use crate::components_cmd::DEFAULT_DEFINITIONS_DIR;

#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    /// The cluster to deploy into; by default as kube-rs finds it (`KUBECONFIG`,
    /// `~/.kube/config`, or the pod's service account).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Directory of user component definitions (*.yaml).
    #[arg(long, default_value = DEFAULT_DEFINITIONS_DIR)]
    pub definitions_dir: PathBuf,
}

/// Runs `kvol components apply`: exit 0 when everything was applied and pruned, 1 when
/// something failed (each named), 2 for an invalid storage section.
pub fn run_apply(args: &ApplyArgs, storage: &StorageSection) -> anyhow::Result<ExitCode> {
    let (catalogue, problems) = Catalogue::load(&args.definitions_dir);
    for problem in &problems {
        eprintln!("kvol: component definition left out: {problem}");
    }
    let decision = match decide_for_cluster(storage, &catalogue) {
        Ok(decision) => decision,
        Err(problems) => {
            for problem in &problems {
                eprintln!("kvol: invalid config: {problem}");
            }
            return Ok(ExitCode::from(2));
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let client = kvol_cluster::client::client(args.kubeconfig.as_deref()).await?;
        // Where deployed objects may be: the kinds of today's bundles and of every earlier apply.
        let mut kinds = kvol_cluster::bundles::bundle_kinds(&catalogue);
        kinds.extend(kvol_cluster::bundles::inventory_kinds(&client).await.map_err(anyhow::Error::msg)?);
        let deployed = kvol_cluster::bundles::deployed(&client, &kinds).await.map_err(anyhow::Error::msg)?;
        let plan = bundle::plan(&decision, &catalogue, &deployed);
        for problem in &plan.problems {
            eprintln!("kvol: {problem}");
        }
        // The inventory first: a kind is remembered before an object of it exists.
        kvol_cluster::bundles::write_inventory(&client, &kinds).await.map_err(anyhow::Error::msg)?;
        let outcome = kvol_cluster::bundles::carry_out(&client, &plan).await;
        for applied in &outcome.applied {
            println!("applied {applied}");
        }
        for pruned in &outcome.pruned {
            println!("pruned {pruned}");
        }
        for component in &plan.left_alone {
            println!("left alone: component {component} is off; its objects stay as they are");
        }
        for failure in &outcome.failed {
            eprintln!("kvol: {failure}");
        }
        let ok = outcome.failed.is_empty() && plan.problems.is_empty();
        Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
    })
}
