//! `kvol components apply`: the components the config turns on deployed into a cluster from their bundles, what their bundles dropped pruned, the ones turned off left alone.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use kvol_api::StorageSection;
use kvol_components::{Catalogue, bundle, decide_for_cluster};

use crate::components_common::DEFAULT_DEFINITIONS_DIR;

#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    /// The cluster to deploy into; by default as kube-rs finds it (`KUBECONFIG`,
    /// `~/.kube/config`, or the pod's service account).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Directory of user component definitions (*.yaml).
    #[arg(long, default_value = DEFAULT_DEFINITIONS_DIR)]
    pub definitions_dir: PathBuf,
    /// kvol's container image, which the built-in bundles run (`{image}` in a bundle); kvol
    /// publishes none: build it from `deploy/kvol/Containerfile`.
    #[arg(long, env = "KVOL_IMAGE", value_name = "REFERENCE")]
    pub image: Option<String>,
}

/// Runs `kvol components apply`: exit 0 when everything was applied and pruned, 1 when
/// something failed (each named), 2 for an invalid storage section.
pub fn run_apply(args: &ApplyArgs, storage: &StorageSection) -> anyhow::Result<ExitCode> {
    let catalogue = crate::components_common::load_catalogue(&args.definitions_dir);
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
        let values = bundle::BundleValues { image: args.image.clone() };
        let plan = bundle::plan(&decision, &catalogue, &deployed, &values);
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

/// `kvol components uninstall NAME --kubeconfig FILE`: refused while the config turns the
/// component on or anything in the cluster depends on it (each named; `--force` names them as
/// orphaned instead); then its deployed objects are deleted, workloads first, a definition
/// another component's bundle shares kept.
pub fn run_uninstall(
    args: &crate::components_common::UninstallArgs,
    kubeconfig: &std::path::Path,
    storage: &StorageSection,
) -> anyhow::Result<ExitCode> {
    let (catalogue, _) = Catalogue::load(&args.definitions_dir);
    let Some((entry, _)) = catalogue.resolve(&args.name) else {
        anyhow::bail!("no component named {:?} (known: {})", args.name, catalogue.known_names().join(", "));
    };
    let definition = entry.definition.clone();
    let decision = decide_for_cluster(storage, &catalogue)
        .map_err(|problems| anyhow::anyhow!("invalid storage section: {problems:?}"))?;
    if decision.verdict(&definition.name).is_some_and(|v| v.runs()) {
        eprintln!(
            "kvol: component {} is on in the config's storage section: turn it off first, then uninstall",
            definition.name
        );
        return Ok(ExitCode::FAILURE);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let client = kvol_cluster::client::client(Some(kubeconfig)).await?;
        let found = kvol_cluster::bundles::holders(&client, &definition).await.map_err(anyhow::Error::msg)?;
        if let Some(refused) =
            crate::components_common::refuse_orphaning(&definition.name, &found, args.force)
        {
            return Ok(refused);
        }
        let mut kinds = kvol_cluster::bundles::bundle_kinds(&catalogue);
        kinds.extend(kvol_cluster::bundles::inventory_kinds(&client).await.map_err(anyhow::Error::msg)?);
        let deployed = kvol_cluster::bundles::deployed(&client, &kinds).await.map_err(anyhow::Error::msg)?;
        let (delete, kept) = bundle::removal(&definition.name, &deployed, &catalogue);
        let outcome = kvol_cluster::bundles::delete_all(&client, &delete).await;
        for deleted in &outcome.pruned {
            println!("deleted {deleted}");
        }
        for shared in &kept {
            println!("kept {shared}: another component's bundle has it");
        }
        for failure in &outcome.failed {
            eprintln!("kvol: {failure}");
        }
        if !outcome.failed.is_empty() {
            return Ok(ExitCode::FAILURE);
        }
        println!("component {} uninstalled from the cluster", definition.name);
        Ok(ExitCode::SUCCESS)
    })
}

/// One component in `kvol components status --kubeconfig`.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ClusterStatusRow {
    /// What the config decides, in words (`runs: …`, `off: …`, `blocked: …`).
    decision: String,
    #[serde(flatten)]
    footprint: kvol_components::cluster_footprint::ClusterFootprint,
}

/// `kvol components status --kubeconfig FILE`: per component, what the config decides for a
/// cluster, its deployed objects, its workloads' readiness and requests, its driver's volumes.
pub fn run_status(
    args: &crate::components_common::StatusArgs,
    kubeconfig: &std::path::Path,
    storage: &StorageSection,
) -> anyhow::Result<ExitCode> {
    use kvol_components::cluster_footprint::footprint;
    let catalogue = crate::components_common::load_catalogue(&args.definitions_dir);
    let decision = decide_for_cluster(storage, &catalogue).map_err(|problems| {
        anyhow::anyhow!("invalid storage section: {}", crate::components_common::joined(&problems))
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (deployed, volumes) = runtime.block_on(async {
        let client = kvol_cluster::client::client(Some(kubeconfig)).await?;
        let mut kinds = kvol_cluster::bundles::bundle_kinds(&catalogue);
        kinds.extend(kvol_cluster::bundles::inventory_kinds(&client).await.map_err(anyhow::Error::msg)?);
        let deployed =
            kvol_cluster::bundles::deployed_objects(&client, &kinds).await.map_err(anyhow::Error::msg)?;
        let volumes = kvol_cluster::bundles::persistent_volumes(&client).await.map_err(anyhow::Error::msg)?;
        anyhow::Ok((deployed, volumes))
    })?;
    let rows: Vec<ClusterStatusRow> = catalogue
        .entries()
        .iter()
        .map(|entry| {
            let name = entry.definition.name.as_str();
            let mine: Vec<_> = deployed
                .iter()
                .filter(|(d, _)| d.component == name)
                .map(|(d, object)| (d.object.clone(), object.clone()))
                .collect();
            let decision = decision
                .verdict(name)
                .map_or_else(|| "unknown".to_string(), |v| format!("{}: {}", v.word(), v.reason()));
            ClusterStatusRow { decision, footprint: footprint(&entry.definition, &mine, &volumes) }
        })
        .collect();
    match args.output {
        crate::components_common::Format::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
        crate::components_common::Format::Table => {
            for row in &rows {
                println!("{}: {}", row.footprint.component, row.decision);
                print!("{}", row.footprint);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
