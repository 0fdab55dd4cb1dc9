//! The component runtime as the agent holds it: the running set started from the config, kvol's config file and the components' own files watched, each change applied.
//!
//! The agent's loop waits on [`ComponentRuntime::next_change`] (cancel-safe: it only
//! receives) beside its other wake-ups, then hands the change to [`ComponentRuntime::apply`],
//! which runs to its end; the loop reads back [`ComponentRuntime::snapshots_on`],
//! [`ComponentRuntime::problems`] and [`ComponentRuntime::states`].

use std::path::{Path, PathBuf};

use crate::components::{ComponentConfigWatch, ComponentStates, Components, ComponentsSetup, ConfigWatch};
use crate::supervisor::{ProcessSpec, SupervisorSettings};

/// A change the runtime was told of: a component's own config file, or kvol's config file
/// (its storage section, or why it could not be read).
#[derive(Debug)]
pub enum ComponentChange {
    ComponentFile(PathBuf),
    KvolConfig(Result<kvol_api::StorageSection, String>),
}

/// The storage components a standalone agent runs, and the watches that change them.
#[derive(Debug)]
pub struct ComponentRuntime {
    components: Components,
    setup: Option<ComponentsSetup>,
    config_watch: Option<ConfigWatch>,
    component_config_watch: Option<ComponentConfigWatch>,
    snapshots_on: bool,
    /// Why the last change of the config file was not applied, until one is.
    config_problem: Option<String>,
}

impl ComponentRuntime {
    /// Starts the components `setup`'s decision asks for (none without a setup), supervised
    /// as `settings` say, and, with a setup, watches `config_file` and the components' config
    /// directory. An invalid storage section is an error listing every problem.
    pub async fn start(
        setup: Option<ComponentsSetup>,
        config_file: Option<&Path>,
        settings: SupervisorSettings,
    ) -> Result<ComponentRuntime, String> {
        let mut components = Components::new(settings);
        let mut snapshots_on = false;
        if let Some(setup) = &setup {
            let (specs, snapshots) = planned_processes(setup)?;
            components.apply(specs).await;
            snapshots_on = snapshots;
        }
        let config_watch = match (&setup, config_file) {
            (Some(_), Some(path)) => Some(ConfigWatch::start(path).map_err(|e| e.to_string())?),
            _ => None,
        };
        let component_config_watch = setup.as_ref().and_then(|setup| {
            let dir = &setup.paths.config_dir;
            match ComponentConfigWatch::start(dir) {
                Ok(watch) => Some(watch),
                Err(e) => {
                    tracing::info!(dir = %dir.display(), error = %e, "components' config files not watched");
                    None
                }
            }
        });
        Ok(ComponentRuntime {
            components,
            setup,
            config_watch,
            component_config_watch,
            snapshots_on,
            config_problem: None,
        })
    }

    /// The next change to apply; never, without watches. Cancel-safe.
    pub async fn next_change(&mut self) -> ComponentChange {
        tokio::select! {
            Some(path) = next_component_config(&mut self.component_config_watch) => ComponentChange::ComponentFile(path),
            Some(outcome) = next_config(&mut self.config_watch) => ComponentChange::KvolConfig(outcome),
            else => std::future::pending().await,
        }
    }

    /// Applies a change: a component's file refreshes its copy (and tells it); kvol's config
    /// file starts and stops components as its storage section's decision asks.
    pub async fn apply(&mut self, change: ComponentChange) {
        match change {
            ComponentChange::ComponentFile(path) => {
                self.components.config_changed(&path).await;
            }
            ComponentChange::KvolConfig(outcome) => {
                self.config_problem =
                    reload_components(outcome, &mut self.setup, &mut self.components, &mut self.snapshots_on)
                        .await;
            }
        }
    }

    /// Whether the agent takes VolumeSnapshots (the `snapshot-controller` component runs).
    pub fn snapshots_on(&self) -> bool {
        self.snapshots_on
    }

    /// What the status shows: why the config file's last change was not applied, then the
    /// components' own files that were not put in place.
    pub fn problems(&self) -> Vec<String> {
        self.config_problem.iter().cloned().chain(self.components.config_problems()).collect()
    }

    /// The supervised processes, for the status report.
    pub fn states(&self) -> ComponentStates {
        self.components.states()
    }

    /// Stops every component process.
    pub async fn stop_all(&mut self) {
        self.components.stop_all().await;
    }
}

/// The next component config file that changed; never, without a watch.
async fn next_component_config(watch: &mut Option<ComponentConfigWatch>) -> Option<PathBuf> {
    let Some(watch) = watch else { return std::future::pending().await };
    watch.changes.recv().await
}

/// The next outcome of the config watch; never, without one.
async fn next_config(watch: &mut Option<ConfigWatch>) -> Option<Result<kvol_api::StorageSection, String>> {
    let Some(watch) = watch else { return std::future::pending().await };
    watch.changes.changed().await.ok()?;
    watch.changes.borrow_and_update().clone()
}

/// Applies a changed storage section: the components its decision asks for are started and
/// the others stopped. An unreadable file or an invalid section changes nothing; the reason
/// is returned for the status.
async fn reload_components(
    outcome: Result<kvol_api::StorageSection, String>,
    setup: &mut Option<ComponentsSetup>,
    components: &mut Components,
    snapshots_on: &mut bool,
) -> Option<String> {
    let Some(running) = setup else { return None };
    let storage = match outcome {
        Ok(storage) => storage,
        Err(reason) => {
            tracing::warn!(%reason, "config change not applied; the running components stay");
            return Some(format!("config change not applied: {reason}"));
        }
    };
    if storage == running.storage {
        return None;
    }
    let candidate = ComponentsSetup { storage, ..running.clone() };
    match planned_processes(&candidate) {
        Ok((specs, snapshots)) => {
            tracing::info!("storage section changed; applying");
            components.apply(specs).await;
            *snapshots_on = snapshots;
            *running = candidate;
            None
        }
        Err(reason) => {
            tracing::warn!(%reason, "config change not applied; the running components stay");
            Some(format!("config change not applied: {reason}"))
        }
    }
}

/// The component processes the setup's decision asks for; an invalid storage section stops
/// the agent with every problem listed.
fn planned_processes(setup: &ComponentsSetup) -> Result<(Vec<ProcessSpec>, bool), String> {
    match setup.plan() {
        Ok((decision, specs)) => {
            for warning in &decision.warnings {
                tracing::warn!(%warning, "storage components");
            }
            Ok((specs, crate::components::runs_snapshots(&decision, &setup.catalogue)))
        }
        Err(problems) => {
            let listed: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
            Err(format!("invalid storage section: {}", listed.join("; ")))
        }
    }
}
