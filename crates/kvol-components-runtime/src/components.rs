//! The storage components the agent runs standalone: the config's decision turned into supervised processes, started, stopped and replaced as the decision changes.
//!
//! What should run is [`kvol_components::decide`]'s answer, never a copy of its rules; this
//! module only fills a chosen component's command line ([`process_specs`], pure) and keeps the
//! running set equal to it ([`Components::apply`]). A component's process meets the agent only
//! through plugin registration, as any driver does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kvol_api::StorageSection;
use kvol_components::definition::{Standalone, fill_command};
use kvol_components::{Catalogue, ConfigProblem, Decision, NodeFacts, decide};

use crate::component_config::{ComponentConfig, Refresh};
use crate::supervisor::{ProcessSpec, ProcessState, Supervised, SupervisorSettings};

/// Where the agent keeps what component processes need; fills the definitions' placeholders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentPaths {
    /// `{kvol}`: the kvol binary the agent runs as.
    pub kvol_binary: PathBuf,
    /// `{node}`.
    pub node_name: String,
    /// Kubelet's root dir: `{socket}` is `<root>/plugins/<csi driver>/csi.sock`,
    /// `{registration-dir}` is `<root>/plugins_registry`.
    pub root_dir: PathBuf,
    /// kvol's state dir: `{state-dir}` is `<state>/csi-<component>`, logs go to
    /// `<state>/logs/<component>.log`, pid files to `<state>/components/<component>.pid`.
    pub state_dir: PathBuf,
    /// The user's config files of components, `<config dir>/<component>.yaml`; `{config}` is
    /// kvol's checked copy, `<state>/components/<component>.yaml`.
    pub config_dir: PathBuf,
}

impl ComponentPaths {
    /// The CSI socket of a component's driver.
    pub fn socket(&self, csi_driver: &str) -> PathBuf {
        self.root_dir.join("plugins").join(csi_driver).join("csi.sock")
    }

    fn registration_dir(&self) -> PathBuf {
        self.root_dir.join("plugins_registry")
    }

    /// Where a component keeps its data (`{state-dir}`); the bundled driver's is `csi-hostpath`.
    pub fn component_state_dir(&self, component: &str) -> PathBuf {
        self.state_dir.join(format!("csi-{component}"))
    }

    /// A component's log file.
    pub fn log_file(&self, component: &str) -> PathBuf {
        self.state_dir.join("logs").join(format!("{component}.log"))
    }

    fn pid_file(&self, process: &str) -> PathBuf {
        self.state_dir.join("components").join(format!("{process}.pid"))
    }

    /// The user's own config file of a component.
    pub fn user_config(&self, component: &str) -> PathBuf {
        self.config_dir.join(format!("{component}.yaml"))
    }

    /// kvol's copy of a component's config, the file its process reads (`{config}`).
    pub fn config_copy(&self, component: &str) -> PathBuf {
        self.state_dir.join("components").join(format!("{component}.yaml"))
    }
}

/// The standalone inputs of the decision: the config's section, the definitions, the node.
#[derive(Clone, Debug)]
pub struct ComponentsSetup {
    pub storage: StorageSection,
    pub catalogue: Catalogue,
    pub facts: NodeFacts,
    pub paths: ComponentPaths,
}

impl ComponentsSetup {
    /// The decision for this setup, and the processes it asks for.
    pub fn plan(&self) -> Result<(Decision, Vec<ProcessSpec>), Vec<ConfigProblem>> {
        let decision = decide(&self.storage, &self.catalogue, &self.facts)?;
        let specs = process_specs(&decision, &self.catalogue, &self.paths);
        Ok((decision, specs))
    }
}

/// Whether the decision runs a component that is the agent's own snapshot support
/// (`standalone: inAgent: snapshots`, the `snapshot-controller`). Pure.
pub fn runs_snapshots(decision: &Decision, catalogue: &Catalogue) -> bool {
    use kvol_components::definition::AgentFeature;
    decision.running().any(|name| {
        catalogue.get(name).is_some_and(|entry| {
            matches!(entry.definition.standalone, Some(Standalone::InAgent(AgentFeature::Snapshots)))
        })
    })
}

/// The processes of every component the decision runs that runs as a process: its command
/// (and its registrar's, named `<component>-registrar`) with the placeholders filled. Pure.
pub fn process_specs(decision: &Decision, catalogue: &Catalogue, paths: &ComponentPaths) -> Vec<ProcessSpec> {
    let mut specs = Vec::new();
    for name in decision.running() {
        let Some(entry) = catalogue.get(name) else { continue };
        let Some(Standalone::Process(process)) = &entry.definition.standalone else { continue };
        let socket = entry.definition.provides.csi_driver.as_deref().map(|driver| paths.socket(driver));
        let kvol = paths.kvol_binary.display().to_string();
        let socket_text = socket.as_ref().map(|s| s.display().to_string()).unwrap_or_default();
        let registration = paths.registration_dir().display().to_string();
        let state = paths.component_state_dir(name).display().to_string();
        let config = paths.config_copy(name).display().to_string();
        let values = [
            ("{kvol}", kvol.as_str()),
            ("{node}", paths.node_name.as_str()),
            ("{socket}", socket_text.as_str()),
            ("{registration-dir}", registration.as_str()),
            ("{state-dir}", state.as_str()),
            ("{config}", config.as_str()),
        ];
        let config_file =
            process.command.iter().any(|arg| arg.contains("{config}")).then(|| ComponentConfig {
                component: name.to_string(),
                source: paths.user_config(name),
                copy: paths.config_copy(name),
                spec: process.config.clone(),
                check: process.config.check.as_ref().map(|check| fill_command(check, &values)),
            });
        specs.push(ProcessSpec {
            name: name.to_string(),
            command: fill_command(&process.command, &values),
            csi_socket: socket,
            log_file: paths.log_file(name),
            pid_file: Some(paths.pid_file(name)),
            config: config_file,
            reload: process.reload,
        });
        if let Some(registrar) = &process.registrar {
            let registrar_name = format!("{name}-registrar");
            specs.push(ProcessSpec {
                command: fill_command(registrar, &values),
                csi_socket: None,
                log_file: paths.log_file(&registrar_name),
                pid_file: Some(paths.pid_file(&registrar_name)),
                config: None,
                reload: Default::default(),
                name: registrar_name,
            });
        }
    }
    specs
}

/// A component process as the status report shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentStatus {
    pub name: String,
    #[serde(flatten)]
    pub state: ProcessState,
}

/// The running processes' live states, readable while [`Components`] is busy applying a plan.
#[derive(Clone, Debug, Default)]
pub struct ComponentStates(Arc<Mutex<BTreeMap<String, Arc<Mutex<ProcessState>>>>>);

impl ComponentStates {
    /// Every running process's state now, by name.
    pub fn snapshot(&self) -> Vec<ComponentStatus> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.iter()
            .map(|(name, state)| ComponentStatus {
                name: name.clone(),
                state: state.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            })
            .collect()
    }

    fn set(&self, running: &BTreeMap<String, (ProcessSpec, Supervised)>) {
        let handles = running.iter().map(|(name, (_, s))| (name.clone(), s.state_handle())).collect();
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = handles;
    }
}

/// The component processes running now, kept equal to the latest plan.
#[derive(Debug, Default)]
pub struct Components {
    running: BTreeMap<String, (ProcessSpec, Supervised)>,
    /// Processes the plan wants that wait for a valid config: theirs was refused and there is
    /// no earlier copy to run with.
    held: BTreeMap<String, ProcessSpec>,
    /// Why a component's config file was not put in place, by component.
    config_problems: BTreeMap<String, String>,
    settings: SupervisorSettings,
    states: ComponentStates,
}

impl Components {
    pub fn new(settings: SupervisorSettings) -> Components {
        Components { settings, ..Components::default() }
    }

    /// A reader of the processes' states that follows every later [`Components::apply`].
    pub fn states(&self) -> ComponentStates {
        self.states.clone()
    }

    /// Stops the processes the plan no longer has (or has with another command line) and
    /// starts those it adds, each once its config copy is in place. A stopped component's
    /// data stays where it is.
    pub async fn apply(&mut self, specs: Vec<ProcessSpec>) {
        let wanted: BTreeMap<String, ProcessSpec> = specs.into_iter().map(|s| (s.name.clone(), s)).collect();
        self.held.retain(|name, spec| wanted.get(name) == Some(spec));
        self.config_problems.retain(|name, _| wanted.contains_key(name));
        let stale: Vec<String> = self
            .running
            .iter()
            .filter(|(name, (spec, _))| wanted.get(*name) != Some(spec))
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            if let Some((_, supervised)) = self.running.remove(&name) {
                tracing::info!(component = %name, "stopping component");
                self.states.set(&self.running);
                supervised.stop().await;
            }
        }
        for (name, spec) in wanted {
            if self.running.contains_key(&name) || self.held.contains_key(&name) {
                continue;
            }
            if let Some(config) = &spec.config {
                let refreshed = self.refresh_config(config).await;
                if refreshed.is_err() && !config.copy.exists() {
                    tracing::warn!(component = %name, "not started until its config file is valid");
                    self.held.insert(name, spec);
                    continue;
                }
            }
            self.start(spec);
        }
        self.states.set(&self.running);
    }

    fn start(&mut self, spec: ProcessSpec) {
        // The socket's directory too, as a DaemonSet's DirectoryOrCreate hostPath would make
        // it: upstream drivers bind their endpoint without making its directory.
        for dir in [&spec.pid_file, &spec.csi_socket].into_iter().flatten().filter_map(|p| p.parent()) {
            if let Err(e) = std::fs::create_dir_all(dir) {
                tracing::warn!(component = %spec.name, dir = %dir.display(), error = %e, "cannot create directory");
            }
        }
        tracing::info!(component = %spec.name, command = %spec.command.join(" "), "starting component");
        let supervised = Supervised::start(spec.clone(), self.settings);
        self.running.insert(spec.name.clone(), (spec, supervised));
    }

    /// Puts the component's config copy in line with its user file, keeping why not.
    async fn refresh_config(&mut self, config: &ComponentConfig) -> Result<Refresh, String> {
        let outcome = config.refresh().await;
        match &outcome {
            Ok(_) => {
                self.config_problems.remove(&config.component);
            }
            Err(reason) => {
                tracing::warn!(component = %config.component, %reason, "component config not put in place");
                self.config_problems.insert(config.component.clone(), reason.clone());
            }
        }
        outcome
    }

    /// The user's file `path` changed: each component it configures gets a fresh checked
    /// copy and is told as its definition says (SIGHUP, or a restart), or started if it was
    /// waiting for a valid config. A refused edit tells nobody. Returns the components told or
    /// started.
    pub async fn config_changed(&mut self, path: &Path) -> Vec<String> {
        use kvol_components::definition::Reload;
        let configures = |spec: &ProcessSpec| spec.config.as_ref().is_some_and(|c| c.source == path);
        let mut told = Vec::new();
        let held: Vec<String> =
            self.held.iter().filter(|(_, s)| configures(s)).map(|(n, _)| n.clone()).collect();
        for name in held {
            let Some(spec) = self.held.remove(&name) else { continue };
            let config = spec.config.clone().expect("held processes have a config");
            if self.refresh_config(&config).await.is_ok() || config.copy.exists() {
                self.start(spec);
                told.push(name);
            } else {
                self.held.insert(name, spec);
            }
        }
        let running: Vec<String> =
            self.running.iter().filter(|(_, (s, _))| configures(s)).map(|(n, _)| n.clone()).collect();
        for name in running {
            let Some(config) = self.running.get(&name).and_then(|(spec, _)| spec.config.clone()) else {
                continue;
            };
            if self.refresh_config(&config).await != Ok(Refresh::Replaced) {
                continue;
            }
            let Some((spec, supervised)) = self.running.remove(&name) else { continue };
            match spec.reload {
                Reload::Sighup => {
                    tracing::info!(component = %name, file = %config.copy.display(), "config changed; SIGHUP");
                    supervised.signal(nix::sys::signal::Signal::SIGHUP);
                    self.running.insert(name.clone(), (spec, supervised));
                }
                Reload::Restart => {
                    tracing::info!(component = %name, file = %config.copy.display(), "config changed; restarting");
                    supervised.stop().await;
                    let restarted = Supervised::start(spec.clone(), self.settings);
                    self.running.insert(name.clone(), (spec, restarted));
                }
            }
            told.push(name);
        }
        self.states.set(&self.running);
        told
    }

    /// Why components' config files were not put in place, for the status: one line each.
    pub fn config_problems(&self) -> Vec<String> {
        self.config_problems
            .iter()
            .map(|(name, reason)| {
                let consequence = if self.held.contains_key(name) {
                    "it is not started until the file is valid"
                } else {
                    "it keeps running with its last good config"
                };
                format!("component {name}: config not applied: {reason}; {consequence}")
            })
            .collect()
    }

    /// Stops every process.
    pub async fn stop_all(&mut self) {
        self.apply(Vec::new()).await;
    }
}

/// kvol's config file watched for the storage section: every change that lands (written and
/// closed, renamed into place, removed) is read and checked on the watcher's thread, and the
/// outcome sent on. A file that does not parse, has invalid gates, or is gone is an `Err` with
/// the reason; the agent then keeps what runs.
#[derive(Debug)]
pub struct ConfigWatch {
    _watched: kvol_plugin::watched_dir::WatchedDir,
    /// The latest outcome; `None` until the first change.
    pub changes: tokio::sync::watch::Receiver<Option<Result<StorageSection, String>>>,
}

impl ConfigWatch {
    /// Watches the directory holding `path` for changes of `path`.
    pub fn start(path: &Path) -> Result<ConfigWatch, kvol_plugin::watched_dir::WatchError> {
        let dir = path.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        let name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
        let (sender, changes) = tokio::sync::watch::channel(None);
        let file = path.to_path_buf();
        let relevant = move |event: &notify::Event, _: &Path| {
            kvol_plugin::watched_dir::may_change_content(event)
                && (event.need_rescan()
                    || event.paths.is_empty()
                    || event.paths.iter().any(|p| p.file_name() == Some(name.as_os_str())))
        };
        let read = move || {
            sender.send_replace(Some(read_storage_section(&file)));
        };
        let watched = kvol_plugin::watched_dir::WatchedDir::start(
            dir,
            "kvol-config",
            relevant,
            kvol_plugin::watched_dir::Quiet::default(),
            read,
        )?;
        Ok(ConfigWatch { _watched: watched, changes })
    }
}

/// The components' own config files (`<config dir>/<component>.yaml`) watched for changes of
/// their content: each landed change is compared with what was last seen, and the files whose
/// content differs (appeared, changed or went) are sent on.
#[derive(Debug)]
pub struct ComponentConfigWatch {
    _watched: kvol_plugin::watched_dir::WatchedDir,
    pub changes: tokio::sync::mpsc::UnboundedReceiver<PathBuf>,
}

impl ComponentConfigWatch {
    /// Watches `dir` (which must exist) for the `*.yaml` files of components.
    pub fn start(dir: &Path) -> Result<ComponentConfigWatch, kvol_plugin::watched_dir::WatchError> {
        let (sender, changes) = tokio::sync::mpsc::unbounded_channel();
        let mut seen: BTreeMap<PathBuf, Option<Vec<u8>>> = yaml_files(dir);
        let watched_dir = dir.to_path_buf();
        let read = move || {
            let now = yaml_files(&watched_dir);
            let paths: std::collections::BTreeSet<&PathBuf> = seen.keys().chain(now.keys()).collect();
            for path in paths {
                if seen.get(path).cloned().flatten() != now.get(path).cloned().flatten() {
                    let _ = sender.send(path.clone());
                }
            }
            seen = now;
        };
        let relevant = |event: &notify::Event, _: &Path| kvol_plugin::watched_dir::may_change_content(event);
        let watched = kvol_plugin::watched_dir::WatchedDir::start(
            dir.to_path_buf(),
            "kvol-component-config",
            relevant,
            kvol_plugin::watched_dir::Quiet::default(),
            read,
        )?;
        Ok(ComponentConfigWatch { _watched: watched, changes })
    }
}

/// The `*.yaml` files directly in `dir` with their content (none when unreadable).
fn yaml_files(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let Ok(entries) = std::fs::read_dir(dir) else { return BTreeMap::new() };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| {
            let content = std::fs::read(&p).ok();
            (p, content)
        })
        .collect()
}

/// The storage section of kvol's config file at `path`, once the whole file is valid.
pub fn read_storage_section(path: &Path) -> Result<StorageSection, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    // An empty file is a write cut short (or not yet made), not a wish for the defaults.
    if text.trim().is_empty() {
        return Err(format!("config file {} is empty (write {{}} for the defaults)", path.display()));
    }
    let config: kvol_api::KvolConfig =
        serde_saphyr::from_str(&text).map_err(|e| format!("invalid config file {}: {e}", path.display()))?;
    config.feature_gates(None).map_err(|e| format!("invalid config file {}: {e}", path.display()))?;
    Ok(config.storage)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvol_components::NodeFeature;

    fn paths() -> ComponentPaths {
        ComponentPaths {
            kvol_binary: "/usr/bin/kvol".into(),
            node_name: "node-a".into(),
            root_dir: "/var/lib/kubelet".into(),
            state_dir: "/var/lib/kvol".into(),
            config_dir: "/etc/kvol".into(),
        }
    }

    fn storage(driver: Option<&str>) -> StorageSection {
        StorageSection { driver: driver.map(String::from), ..StorageSection::default() }
    }

    #[test]
    fn the_decision_becomes_filled_command_lines() {
        let catalogue = Catalogue::built_in();
        let lvm_node = NodeFacts { features: [NodeFeature::LvmVolumeGroup].into() };
        let rows: [(&str, StorageSection, NodeFacts, &[&str]); 4] = [
            (
                "unset: the bundled driver on a node without a volume group",
                storage(None),
                NodeFacts::default(),
                &["hostpath"],
            ),
            ("unset: lvm where there is a volume group", storage(None), lvm_node.clone(), &["lvm"]),
            ("none: nothing runs", storage(Some("none")), lvm_node, &[]),
            ("chosen by name", storage(Some("hostpath")), NodeFacts::default(), &["hostpath"]),
        ];
        for (name, storage, facts, want) in rows {
            let setup = ComponentsSetup { storage, catalogue: catalogue.clone(), facts, paths: paths() };
            let (_, specs) = setup.plan().unwrap();
            let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
            assert_eq!(names, want, "{name}");
        }
        let setup = ComponentsSetup {
            storage: storage(None),
            catalogue,
            facts: NodeFacts::default(),
            paths: paths(),
        };
        let (_, specs) = setup.plan().unwrap();
        let hostpath = &specs[0];
        assert_eq!(
            hostpath.command,
            [
                "/usr/bin/kvol",
                "csi-driver",
                "--node-name",
                "node-a",
                "--state-dir",
                "/var/lib/kvol/csi-hostpath",
                "--csi-socket",
                "/var/lib/kubelet/plugins/hostpath.csi.kvol.io/csi.sock",
                "--registration-dir",
                "/var/lib/kubelet/plugins_registry"
            ]
        );
        assert_eq!(
            hostpath.csi_socket.as_deref(),
            Some(Path::new("/var/lib/kubelet/plugins/hostpath.csi.kvol.io/csi.sock"))
        );
        assert_eq!(hostpath.log_file, Path::new("/var/lib/kvol/logs/hostpath.log"));
        assert_eq!(hostpath.pid_file.as_deref(), Some(Path::new("/var/lib/kvol/components/hostpath.pid")));
    }

    #[test]
    fn an_invalid_section_is_refused_with_its_problems() {
        let setup = ComponentsSetup {
            storage: storage(Some("nfs")),
            catalogue: Catalogue::built_in(),
            facts: NodeFacts::default(),
            paths: paths(),
        };
        let problems = setup.plan().unwrap_err();
        assert!(problems.iter().any(|p| p.to_string().contains("nfs")), "{problems:?}");
    }

    #[test]
    fn a_registrar_runs_beside_its_driver_under_its_own_name() {
        let yaml = r#"
name: upstream-hostpath
role: driver
provides: {csiDriver: hostpath.csi.k8s.io}
standalone:
  process:
    command: [/opt/hostpathplugin, "--endpoint=unix://{socket}", "--nodeid={node}"]
    registrar: [/opt/csi-node-driver-registrar, "--csi-address={socket}",
                "--kubelet-registration-path={socket}", "--plugin-registration-path={registration-dir}"]
"#;
        let (catalogue, problems) = Catalogue::with_documents(vec![(
            kvol_components::catalogue::Origin::File("/etc/kvol/components/u.yaml".into()),
            yaml.to_string(),
        )]);
        assert!(problems.is_empty(), "{problems:?}");
        let setup = ComponentsSetup {
            storage: storage(Some("upstream-hostpath")),
            catalogue,
            facts: NodeFacts::default(),
            paths: paths(),
        };
        let (_, specs) = setup.plan().unwrap();
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["upstream-hostpath", "upstream-hostpath-registrar"]);
        let socket = "/var/lib/kubelet/plugins/hostpath.csi.k8s.io/csi.sock";
        assert_eq!(specs[0].command[1], format!("--endpoint=unix://{socket}"));
        assert_eq!(specs[1].command[3], "--plugin-registration-path=/var/lib/kubelet/plugins_registry");
        assert_eq!(specs[1].csi_socket, None, "the registrar is kept running, not probed");
    }

    #[test]
    fn a_config_file_is_read_whole_or_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kvol.yaml");
        // (what, file text or none, Ok(driver) or Err(words of the reason))
        type Row<'a> = (&'a str, Option<&'a str>, Result<Option<&'a str>, &'a str>);
        let rows: [Row; 6] = [
            ("a driver", Some("storage:\n  driver: none\n"), Ok(Some("none"))),
            ("no storage section", Some("featureGates: {}\n"), Ok(None)),
            ("empty: cut short", Some(""), Err("is empty")),
            ("cut mid-value", Some("storage:\n  driver: [hos"), Err("invalid config file")),
            ("a bad gate", Some("featureGates: {NoSuchGate: true}\n"), Err("invalid config file")),
            ("gone", None, Err("cannot read config file")),
        ];
        for (what, text, want) in rows {
            let _ = std::fs::remove_file(&path);
            if let Some(text) = text {
                std::fs::write(&path, text).unwrap();
            }
            match (read_storage_section(&path), want) {
                (Ok(storage), Ok(driver)) => assert_eq!(storage.driver.as_deref(), driver, "{what}"),
                (Err(e), Err(words)) => {
                    assert!(e.contains(words) && e.contains(&path.display().to_string()), "{what}: {e}")
                }
                (got, _) => panic!("{what}: {got:?}"),
            }
        }
    }
}
