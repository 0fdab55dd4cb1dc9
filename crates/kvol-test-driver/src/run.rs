//! A whole run: the definition read, the driver started or reached, the node set up, each selected case run and timed with its clean-up, the driver stopped and the scratch directory taken away.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::storage::v1::StorageClass;
use kvol_csi::{CsiClient, Timeouts};
use kvol_plugin::{Mounter, SystemMounter};

use crate::cases::{self, Facts, Verdict};
use crate::checks::{self, Ctx, End};
use crate::definition::{ClassSource, DriverDefinition};
use crate::driver::{Driver, DriverSpec};
use crate::node::Node;
use crate::report::{CaseResult, Outcome};

/// The storage class's name in the claims kvol makes.
const CLASS_NAME: &str = "kvol-test-driver-sc";
/// The smallest volume the cases ask for: big enough for volumeIO's files.
const SMALLEST_CLAIM: u64 = 64 << 20;
/// How long one case may take, its clean-up included.
const CASE_TIMEOUT: Duration = Duration::from_secs(300);

/// Why a run could not start (a failed case is not an error: it is in the report).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Definition(#[from] crate::definition::DefinitionError),
    #[error("cannot read {}: {reason}", path.display())]
    Read { path: PathBuf, reason: String },
    #[error(transparent)]
    Driver(#[from] crate::driver::DriverError),
    #[error("csi driver at {}: {reason}", socket.display())]
    Setup { socket: PathBuf, reason: String },
}

/// What a run is asked to do.
#[derive(Clone, Debug)]
pub struct Config {
    pub definition_file: PathBuf,
    pub driver: DriverSpec,
    /// Where kubelet's directories, the driver's socket (when kvol starts it) and its log go;
    /// made if missing, and what kvol made in it removed at the end.
    pub work_dir: PathBuf,
    /// Only cases whose name (or upstream name) contains one of these; all when empty.
    pub focus: Vec<String>,
    /// Each CSI call's deadline.
    pub call_timeout: Duration,
    /// runc and a static busybox, for the cases that run containers; without them those
    /// cases check host-side.
    pub containers: Option<(PathBuf, PathBuf)>,
}

/// The cases that run their checks in a container when there are containers.
pub const IN_CONTAINERS: [&str; 3] = ["volumes-store-data", "volumes-exec", "fsgroup-always"];

/// What a run found.
#[derive(Debug)]
pub struct RunReport {
    /// The driver's name (GetPluginInfo).
    pub driver: String,
    pub results: Vec<CaseResult>,
    pub total: Duration,
    /// The definition's warnings and kvol's own notes about the run.
    pub warnings: Vec<String>,
}

/// Reads the definition file.
pub fn load_definition(path: &Path) -> Result<DriverDefinition, RunError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| RunError::Read { path: path.to_path_buf(), reason: e.to_string() })?;
    Ok(crate::definition::parse(&text, &path.display().to_string())?)
}

/// A file the definition names, relative to the definition's directory.
fn beside(definition_file: &Path, named: &Path) -> PathBuf {
    match definition_file.parent() {
        Some(dir) if named.is_relative() => dir.join(named),
        _ => named.to_path_buf(),
    }
}

/// The storage class the claims use, as upstream makes it from the definition.
fn storage_class(
    definition: &DriverDefinition,
    file: &Path,
    driver: &str,
    notes: &mut Vec<String>,
) -> Result<StorageClass, RunError> {
    let mut class = match &definition.storage_class {
        ClassSource::FromFile(named) => {
            let path = beside(file, named);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| RunError::Read { path: path.clone(), reason: e.to_string() })?;
            serde_saphyr::from_str::<StorageClass>(&text).map_err(|e| RunError::Read {
                path: path.clone(),
                reason: format!("not a StorageClass: {e}"),
            })?
        }
        ClassSource::FromExistingClassName(name) => {
            notes.push(format!(
                "StorageClass.FromExistingClassName {name:?} names a class in a cluster; with none here the class has provisioner {driver} and no parameters"
            ));
            StorageClass { provisioner: driver.to_string(), ..StorageClass::default() }
        }
        ClassSource::FromName | ClassSource::None => {
            StorageClass { provisioner: driver.to_string(), ..StorageClass::default() }
        }
    };
    class.metadata.name = Some(CLASS_NAME.to_string());
    if class.provisioner != driver {
        notes.push(format!(
            "the storage class's provisioner is {}, the driver is {driver}: the driver is used",
            class.provisioner
        ));
    }
    Ok(class)
}

/// The snapshot class's parameters (a FromFile class's `parameters`).
fn snapshot_parameters(
    definition: &DriverDefinition,
    file: &Path,
) -> Result<BTreeMap<String, String>, RunError> {
    let ClassSource::FromFile(named) = &definition.snapshot_class else { return Ok(BTreeMap::new()) };
    let path = beside(file, named);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| RunError::Read { path: path.clone(), reason: e.to_string() })?;
    let value: serde_json::Value = serde_saphyr::from_str(&text)
        .map_err(|e| RunError::Read { path: path.clone(), reason: e.to_string() })?;
    Ok(value
        .get("parameters")
        .and_then(|p| p.as_object())
        .map(|p| p.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect())
        .unwrap_or_default())
}

/// The size the cases' claims ask for: the driver's smallest, at least [`SMALLEST_CLAIM`],
/// at most its largest.
fn claim_size(definition: &DriverDefinition) -> u64 {
    let info = &definition.driver_info;
    let min = kvol_api::quantity::parse_bytes(&info.size_min).unwrap_or(0);
    let max =
        info.size_max.as_deref().and_then(|m| kvol_api::quantity::parse_bytes(m).ok()).unwrap_or(u64::MAX);
    min.max(SMALLEST_CLAIM).min(max)
}

/// Runs every selected case against the driver.
pub async fn run(config: &Config) -> Result<RunReport, RunError> {
    let started = Instant::now();
    let definition = load_definition(&config.definition_file)?;
    let mut warnings: Vec<String> = definition.warnings.clone();
    let run_id = format!("run{}", std::process::id());
    let work = config.work_dir.join(&run_id);
    std::fs::create_dir_all(&work)
        .map_err(|e| RunError::Read { path: work.clone(), reason: format!("cannot make it: {e}") })?;
    let mut driver = match Driver::start(&config.driver, &work).await {
        Ok(driver) => driver,
        Err(e) => {
            remove_work_dir(&work, &mut warnings);
            return Err(e.into());
        }
    };
    let outcome = run_with_driver(config, &definition, &mut driver, &work, &mut warnings).await;
    driver.stop().await;
    remove_work_dir(&work, &mut warnings);
    let results = outcome?;
    Ok(RunReport { driver: definition.driver_info.name.clone(), results, total: started.elapsed(), warnings })
}

async fn run_with_driver(
    config: &Config,
    definition: &DriverDefinition,
    driver: &mut Driver,
    work: &Path,
    warnings: &mut Vec<String>,
) -> Result<Vec<CaseResult>, RunError> {
    let setup = |reason: String| RunError::Setup { socket: driver.socket().to_path_buf(), reason };
    let client = CsiClient::new(
        definition.driver_info.name.clone(),
        driver.socket(),
        Timeouts::with_call(config.call_timeout),
    )
    .map_err(|e| setup(e.to_string()))?;
    let info = client.plugin_info().await.map_err(|e| setup(e.to_string()))?;
    if info.name != definition.driver_info.name {
        warnings.push(format!(
            "the definition names driver {}, the driver says it is {}: kvol uses the driver's name",
            definition.driver_info.name, info.name
        ));
    }
    let node_caps = client.node_get_capabilities().await.map_err(|e| setup(e.to_string()))?;
    let facts =
        Facts { driver_command: driver.is_started_by_kvol(), volume_stats: node_caps.get_volume_stats };
    let class = storage_class(definition, &config.definition_file, &info.name, warnings)?;
    let snapshot_parameters = snapshot_parameters(definition, &config.definition_file)?;
    let node = Node::new(
        &work.join("kubelet"),
        &info.name,
        client,
        class,
        snapshot_parameters,
        !definition.inline_volumes.is_empty(),
    )
    .await
    .map_err(|f| setup(f.message))?;
    let runtime = match &config.containers {
        Some((runc, busybox)) => {
            let runtime = crate::container::Runtime::new(runc, busybox, &work.join("containers"))
                .map_err(|f| setup(f.message))?;
            warnings.push(format!(
                "containers: {} on a root of {}; {} check in containers, the other cases host-side",
                runc.display(),
                busybox.display(),
                IN_CONTAINERS.join(", ")
            ));
            Some(runtime)
        }
        None => {
            warnings.push(
                "no --runc and --busybox: every case checks host-side, through the published path"
                    .to_string(),
            );
            None
        }
    };
    let mut ctx =
        Ctx { node: &node, driver, definition, size: claim_size(definition), containers: runtime.as_ref() };
    let mut results = Vec::new();
    for (case, verdict) in cases::select(definition, facts, &config.focus) {
        let case_started = Instant::now();
        let outcome = match verdict {
            Verdict::Skip(reason) => Outcome::Skipped(reason),
            Verdict::Run => run_case(case.id, &mut ctx).await,
        };
        results.push(CaseResult { case, outcome, elapsed: case_started.elapsed() });
    }
    Ok(results)
}

/// One case and its clean-up, within [`CASE_TIMEOUT`]; a clean-up failure fails a case
/// that had passed.
async fn run_case(id: cases::CaseId, ctx: &mut Ctx<'_>) -> Outcome {
    let body = tokio::time::timeout(CASE_TIMEOUT, checks::run(id, ctx)).await;
    let cleaned = ctx.node.clean_up().await;
    match (body, cleaned) {
        (Err(_), _) => Outcome::Failed(crate::report::Failure::new(format!(
            "the case did not end within {CASE_TIMEOUT:?}"
        ))),
        (Ok(Err(failure)), _) => Outcome::Failed(failure),
        (Ok(Ok(_)), Err(mut failure)) => {
            failure.message = format!("cleaning up after the case: {}", failure.message);
            Outcome::Failed(failure)
        }
        (Ok(Ok(End::Passed)), Ok(())) => Outcome::Passed,
        (Ok(Ok(End::Skipped(reason))), Ok(())) => Outcome::Skipped(reason),
    }
}

/// Removes the run's directory unless something is still mounted below it (then it is left,
/// and said: nothing is ever deleted through a mount).
fn remove_work_dir(work: &Path, warnings: &mut Vec<String>) {
    match SystemMounter.mounts_under(work) {
        Ok(mounts) if mounts.is_empty() => {
            if let Err(e) = std::fs::remove_dir_all(work) {
                warnings.push(format!("cannot remove {}: {e}", work.display()));
            }
        }
        Ok(mounts) => warnings.push(format!(
            "{} left in place: {} mount(s) remain below it, e.g. {}",
            work.display(),
            mounts.len(),
            mounts[0].target.display()
        )),
        Err(e) => {
            warnings.push(format!("{} left in place: cannot read the mount table: {e}", work.display()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::parse;

    #[test]
    fn claims_are_the_drivers_smallest_within_its_range_and_big_enough_for_the_io_case() {
        // (definition size range, claim size)
        let table = [
            ("{}", 5u64 << 30),
            ("{Min: 1Mi}", 64 << 20),
            ("{Min: 1Gi}", 1 << 30),
            ("{Min: 1Mi, Max: 16Mi}", 16 << 20),
        ];
        for (range, size) in table {
            let d = parse(&format!("DriverInfo: {{Name: d, SupportedSizeRange: {range}}}"), "t").unwrap();
            assert_eq!(claim_size(&d), size, "{range}");
        }
    }

    #[test]
    fn classes_come_from_the_definition_as_upstream_makes_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("driver.yaml");
        std::fs::write(dir.path().join("sc.yaml"), "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: fast}\nprovisioner: d\nparameters: {tier: gold}\n").unwrap();
        let mut notes = Vec::new();
        let d = parse("DriverInfo: {Name: d}\nStorageClass: {FromFile: sc.yaml}", "t").unwrap();
        let class = storage_class(&d, &file, "d", &mut notes).unwrap();
        assert_eq!(class.parameters.unwrap()["tier"], "gold");
        assert_eq!(class.metadata.name.as_deref(), Some(CLASS_NAME));
        assert!(notes.is_empty());
        let d = parse("DriverInfo: {Name: d}\nStorageClass: {FromExistingClassName: gold}", "t").unwrap();
        let class = storage_class(&d, &file, "d", &mut notes).unwrap();
        assert_eq!((class.provisioner.as_str(), class.parameters), ("d", None));
        assert!(notes[0].contains("\"gold\" names a class in a cluster"), "{notes:?}");
        let d = parse("DriverInfo: {Name: d}\nStorageClass: {FromFile: missing.yaml}", "t").unwrap();
        assert!(storage_class(&d, &file, "d", &mut notes).unwrap_err().to_string().contains("missing.yaml"));
    }
}
