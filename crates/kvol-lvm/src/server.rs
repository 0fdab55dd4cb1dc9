//! Serving the LVM driver: binds the CSI and registration sockets (kvol-hostpath's binding and registrar), runs both gRPC servers until shutdown, and reloads lvmd.yaml when it changes.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvol_csi::CsiError;
use kvol_csi::proto::csi::{
    controller_server::ControllerServer, identity_server::IdentityServer, node_server::NodeServer,
};
use kvol_csi::proto::registration::registration_server::RegistrationServer;
use kvol_hostpath::RegistrationOutcome;
use kvol_hostpath::registrar::{RegistrarService, plugin_info};
use kvol_hostpath::server::{BoundSocket, DRAIN_TIMEOUT, bind_socket};
use kvol_plugin::mount::Mounter;
use kvol_plugin::watched_dir::{Quiet, WatchedDir, may_change_content};
use tokio::sync::watch;
use tonic::transport::Server;

use crate::LvmDriverConfig;
use crate::controller::ControllerService;
use crate::driver::{Core, Shared, count_owned};
use crate::identity::IdentityService;
use crate::lvm::Lvm;
use crate::lvmd::LvmdConfig;
use crate::node::NodeService;
use crate::reload::{self, Verdict};

/// What one reload of lvmd.yaml did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// The new device classes are in use.
    Applied,
    /// The file says what the running configuration says.
    Unchanged,
    /// Applying it would orphan volumes; the running configuration stays. Every reason.
    Refused(Vec<String>),
    /// The file is unreadable or invalid; the running configuration stays. Every problem.
    Invalid(Vec<String>),
}

/// Re-reads lvmd.yaml for a running driver.
#[derive(Debug, Clone)]
pub struct Reloader {
    core: Shared,
}

impl Reloader {
    /// Reads and validates the file, asks lvm which targets hold the driver's volumes, and
    /// applies the file unless that would orphan some; logs what it did and why.
    pub async fn reload(&self) -> ReloadOutcome {
        let mut core = self.core.lock().await;
        let path = core.config.lvmd_config.clone();
        let next = match reread(&path, &core.config).await {
            Ok(loaded) => loaded.config,
            Err(e) => {
                let problems = e.problems();
                tracing::error!(file = %path.display(), "lvmd.yaml not reloaded, the running configuration stays: {}", problems.join("; "));
                return ReloadOutcome::Invalid(problems);
            }
        };
        let owned = match core.owned().await {
            Ok(lvs) => count_owned(&lvs),
            Err(e) => {
                let why = format!("cannot list the driver's logical volumes: {}", e.message());
                tracing::error!(file = %path.display(), "lvmd.yaml not reloaded: {why}");
                return ReloadOutcome::Refused(vec![why]);
            }
        };
        match reload::decide(&core.lvmd, &next, &owned) {
            Verdict::Unchanged => ReloadOutcome::Unchanged,
            Verdict::Apply => {
                let classes: Vec<String> =
                    next.device_classes.iter().map(|c| format!("{} ({})", c.name, c.target())).collect();
                tracing::info!(file = %path.display(), classes = %classes.join(", "), "lvmd.yaml reloaded");
                core.lvmd = next;
                ReloadOutcome::Applied
            }
            Verdict::Refuse(reasons) => {
                tracing::error!(file = %path.display(), "lvmd.yaml change refused, the running configuration stays: {}", reasons.join("; "));
                ReloadOutcome::Refused(reasons)
            }
        }
    }

    /// The device classes in use now.
    pub async fn running(&self) -> LvmdConfig {
        self.core.lock().await.lvmd.clone()
    }
}

/// lvmd.yaml as a reload reads it: a user's file as it is; a removed or generated one made
/// again from the node's volume groups, as at start.
async fn reread(
    path: &std::path::Path,
    config: &LvmDriverConfig,
) -> Result<crate::config_file::Loaded, crate::config_file::ConfigError> {
    let generated = match std::fs::read_to_string(path) {
        Ok(text) => crate::generate::is_generated(&text),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    };
    if !generated {
        return crate::config_file::load(path);
    }
    let vgs = crate::command::volume_groups(config.lvm_timeout).await.map_err(|e| {
        crate::config_file::ConfigError::VolumeGroups { path: path.into(), reason: e.to_string() }
    })?;
    crate::config_file::ensure(path, &vgs, config.volume_group.as_deref())
}

/// The LVM driver with its sockets bound, ready to [`run`](Self::run).
#[derive(Debug)]
pub struct LvmDriver {
    config: Arc<LvmDriverConfig>,
    core: Shared,
    csi: BoundSocket,
    registration: Option<BoundSocket>,
    outcomes: watch::Sender<Option<RegistrationOutcome>>,
}

impl LvmDriver {
    /// Validates the configuration and binds the sockets (the CSI socket first, so the kubelet,
    /// which reacts to the registration socket, always finds it). `lvmd` is the valid
    /// lvmd.yaml the driver starts with.
    pub fn bind(
        config: LvmDriverConfig,
        lvmd: LvmdConfig,
        mounter: Arc<dyn Mounter>,
    ) -> Result<LvmDriver, CsiError> {
        config.validate()?;
        let config = Arc::new(config);
        let lvm = Lvm::new(config.lvm_timeout);
        let core = Arc::new(tokio::sync::Mutex::new(Core { config: config.clone(), lvmd, lvm, mounter }));
        let csi = bind_socket(&config.csi_socket)?;
        let registration = config.registration_socket().map(|p| bind_socket(&p)).transpose()?;
        let (outcomes, _) = watch::channel(None);
        Ok(LvmDriver { config, core, csi, registration, outcomes })
    }

    pub fn config(&self) -> &LvmDriverConfig {
        &self.config
    }

    pub fn csi_socket(&self) -> &Path {
        self.csi.path()
    }

    pub fn registration_socket(&self) -> Option<&Path> {
        self.registration.as_ref().map(BoundSocket::path)
    }

    /// What the kubelet reports through NotifyRegistrationStatus.
    pub fn registration_outcomes(&self) -> watch::Receiver<Option<RegistrationOutcome>> {
        self.outcomes.subscribe()
    }

    /// A handle that reloads lvmd.yaml (what SIGHUP and file changes do).
    pub fn reloader(&self) -> Reloader {
        Reloader { core: self.core.clone() }
    }

    /// Serves the CSI and registration services, reloading lvmd.yaml whenever it changes,
    /// until `shutdown` completes; then lets connections finish (up to [`DRAIN_TIMEOUT`]) and
    /// removes both sockets.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), CsiError> {
        let LvmDriver { config, core, csi, registration, outcomes } = self;
        let driver = config.driver_name.clone();
        let transport = |what: &Path, e: tonic::transport::Error| CsiError::Driver {
            driver: driver.clone(),
            reason: format!("server on {} failed: {e}", what.display()),
        };
        let (csi_incoming, csi_file) = csi.into_incoming()?;
        let (registration_incoming, registration_file) =
            registration.map(BoundSocket::into_incoming).transpose()?.unzip();
        let csi_path = csi_file.path().to_path_buf();
        let registration_path = registration_file.as_ref().map(|f| f.path().to_path_buf());
        let _watcher = watch_file(&config.lvmd_config, Reloader { core: core.clone() });

        let (stop, stopped) = watch::channel(false);
        let signal = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let csi_server = Server::builder()
            .add_service(IdentityServer::new(IdentityService { core: core.clone() }))
            .add_service(ControllerServer::new(ControllerService { core: core.clone() }))
            .add_service(NodeServer::new(NodeService { core }))
            .serve_with_incoming_shutdown(csi_incoming, signal(stopped.clone()));
        let csi_server = async { csi_server.await.map_err(|e| transport(&csi_path, e)) };
        let registrar = RegistrarService::new(plugin_info(&config.driver_name, &config.csi_socket), outcomes);
        let registration_server = async {
            match (registration_incoming, &registration_path) {
                (Some(incoming), Some(path)) => Server::builder()
                    .add_service(RegistrationServer::new(registrar))
                    .serve_with_incoming_shutdown(incoming, signal(stopped.clone()))
                    .await
                    .map_err(|e| transport(path, e)),
                _ => Ok(()),
            }
        };
        tracing::info!(driver = %config.driver_name, socket = %csi_path.display(), registration = ?registration_path, "serving");
        let servers = async { tokio::try_join!(csi_server, registration_server) };
        tokio::pin!(servers, shutdown);
        tokio::select! {
            result = &mut servers => {
                result?;
                let reason = "the servers stopped by themselves".to_string();
                return Err(CsiError::Driver { driver: config.driver_name.clone(), reason });
            }
            () = &mut shutdown => {}
        }
        let _ = stop.send(true);
        match tokio::time::timeout(DRAIN_TIMEOUT, &mut servers).await {
            Ok(result) => {
                result?;
            }
            Err(_) => {
                tracing::warn!(driver = %config.driver_name, "connections still open after {DRAIN_TIMEOUT:?}; closing them")
            }
        }
        drop(csi_file);
        drop(registration_file);
        Ok(())
    }
}

/// Watches the directory of `file` (kvol's shared [`WatchedDir`]) and reloads once a change
/// naming it has landed; the watch lives as long as the returned value. A directory that
/// cannot be watched is logged (SIGHUP still reloads).
fn watch_file(file: &Path, reloader: Reloader) -> Option<WatchedDir> {
    let dir = file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let name = file.file_name()?.to_os_string();
    let relevant = move |event: &notify::Event, _: &Path| {
        may_change_content(event)
            && (event.need_rescan() || event.paths.iter().any(|p| p.file_name() == Some(name.as_os_str())))
    };
    // The watcher's thread is not the runtime's: it hands each reload to the runtime and waits.
    let runtime = tokio::runtime::Handle::current();
    let read = move || {
        runtime.block_on(reloader.reload());
    };
    match WatchedDir::start(dir.clone(), "kvol-lvmd-config", relevant, Quiet::default(), read) {
        Ok(watched) => Some(watched),
        Err(e) => {
            tracing::error!(dir = %dir.display(), "cannot watch lvmd.yaml's directory: {e}");
            None
        }
    }
}
