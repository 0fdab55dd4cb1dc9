//! Serving the hostpath driver: binds the CSI and registration sockets (stale ones replaced), runs both gRPC servers until shutdown, then removes the sockets.

use std::future::Future;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kvol_plugin::mount::Mounter;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

use crate::HostpathConfig;
use crate::backing::BackingChoice;
use crate::controller::ControllerService;
use crate::driver::Hostpath;
use crate::group::GroupControllerService;
use crate::identity::IdentityService;
use crate::node::NodeService;
use crate::registrar::{RegistrarService, RegistrationOutcome, plugin_info};
use kvol_csi::CsiError;
use kvol_csi::proto::csi::{
    controller_server::ControllerServer, group_controller_server::GroupControllerServer,
    identity_server::IdentityServer, node_server::NodeServer,
};
use kvol_csi::proto::registration::registration_server::RegistrationServer;

/// How long open connections get to finish once shutdown begins.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// A unix socket file this process bound; dropping it removes the file, unless something
/// else has visibly replaced it since (another file, or a socket of another inode or change
/// time).
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    identity: (u64, u64, i64, i64),
}

fn identity(meta: &std::fs::Metadata) -> (u64, u64, i64, i64) {
    (meta.dev(), meta.ino(), meta.ctime(), meta.ctime_nsec())
}

impl SocketFile {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn is_ours(&self) -> bool {
        std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.file_type().is_socket() && identity(&m) == self.identity)
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if self.is_ours()
            && let Err(e) = std::fs::remove_file(&self.path)
        {
            tracing::warn!(socket = %self.path.display(), "cannot remove the socket: {e}");
        }
    }
}

/// A bound socket, listening but not yet served.
#[derive(Debug)]
pub struct BoundSocket {
    listener: std::os::unix::net::UnixListener,
    file: SocketFile,
}

impl BoundSocket {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.file.path
    }

    /// The connections to serve (inside a tokio runtime), and the file guard that removes the
    /// socket when dropped.
    pub fn into_incoming(self) -> Result<(UnixListenerStream, SocketFile), CsiError> {
        let BoundSocket { listener, file } = self;
        match tokio::net::UnixListener::from_std(listener) {
            Ok(l) => Ok((UnixListenerStream::new(l), file)),
            Err(e) => Err(CsiError::io("listen on", &file.path, e)),
        }
    }
}

/// Binds a unix socket on `path`: creates its directory, replaces a stale socket file (never
/// anything else), and listens.
pub fn bind_socket(path: &Path) -> Result<BoundSocket, CsiError> {
    let refuse = |reason: String| CsiError::Registration { socket: path.to_path_buf(), reason };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| CsiError::io("create directory", dir, e))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|e| CsiError::io("remove the stale socket", path, e))?;
            tracing::info!(socket = %path.display(), "removed a stale socket");
        }
        Ok(_) => return Err(refuse("something other than a socket is there; refusing to replace it".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(CsiError::io("inspect", path, e)),
    }
    let listener =
        std::os::unix::net::UnixListener::bind(path).map_err(|e| CsiError::io("listen on", path, e))?;
    let bound = |e| CsiError::io("inspect", path, e);
    let meta = std::fs::symlink_metadata(path).map_err(bound)?;
    let file = SocketFile { path: path.to_path_buf(), identity: identity(&meta) };
    listener.set_nonblocking(true).map_err(|e| CsiError::io("configure", path, e))?;
    Ok(BoundSocket { listener, file })
}

/// The hostpath driver, its state loaded and its sockets bound, ready to [`run`](Self::run).
#[derive(Debug)]
pub struct HostpathDriver {
    config: Arc<HostpathConfig>,
    backing: BackingChoice,
    core: Hostpath,
    csi: BoundSocket,
    registration: Option<BoundSocket>,
    outcomes: watch::Sender<Option<RegistrationOutcome>>,
}

impl HostpathDriver {
    /// Validates the configuration, decides the volume backing (`auto` probed here, once:
    /// [`crate::backing::resolve`]), loads the state and binds the sockets: the CSI socket
    /// first, then the registration socket, so the kubelet, which reacts to the latter, always
    /// finds the former. Connections queue until [`run`](Self::run).
    pub fn bind(config: HostpathConfig, mounter: Arc<dyn Mounter>) -> Result<HostpathDriver, CsiError> {
        config.validate()?;
        let backing = crate::backing::resolve(config.volume_backing);
        let config = Arc::new(HostpathConfig { volume_backing: backing.backing, ..config });
        let core = Hostpath::open(config.clone(), mounter)?;
        let csi = bind_socket(&config.csi_socket)?;
        let registration = config.registration_socket().map(|path| bind_socket(&path)).transpose()?;
        let (outcomes, _) = watch::channel(None);
        Ok(HostpathDriver { config, backing, core, csi, registration, outcomes })
    }

    /// Binds, then runs until `shutdown` completes: the whole driver in one call.
    pub async fn serve(
        config: HostpathConfig,
        mounter: Arc<dyn Mounter>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), CsiError> {
        HostpathDriver::bind(config, mounter)?.run(shutdown).await
    }

    /// The configuration it runs with: `volume_backing` is the backing decided, never `Auto`.
    pub fn config(&self) -> &HostpathConfig {
        &self.config
    }

    /// The backing new filesystem volumes get, and why.
    pub fn backing(&self) -> &BackingChoice {
        &self.backing
    }

    /// The CSI socket's path.
    pub fn csi_socket(&self) -> &Path {
        &self.csi.file.path
    }

    /// The registration socket's path, when registration is on.
    pub fn registration_socket(&self) -> Option<&Path> {
        self.registration.as_ref().map(|s| s.file.path.as_path())
    }

    /// What the kubelet reports through NotifyRegistrationStatus, latest first.
    pub fn registration_outcomes(&self) -> watch::Receiver<Option<RegistrationOutcome>> {
        self.outcomes.subscribe()
    }

    /// Serves the CSI services and the registration service until `shutdown` completes, then
    /// lets open connections finish (for up to [`DRAIN_TIMEOUT`]) and removes both sockets.
    ///
    /// With `exit_on_registration_failure`, a failure reported by the kubelet ends the run
    /// too, with an error. Must run inside a tokio runtime; mounts happen on the thread that
    /// polls the request, never on a blocking pool.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), CsiError> {
        let HostpathDriver { config, backing, core, csi, registration, outcomes } = self;
        let driver = config.driver_name.clone();
        let transport = |what: &Path, e: tonic::transport::Error| CsiError::Driver {
            driver: driver.clone(),
            reason: format!("server on {} failed: {e}", what.display()),
        };
        let listen = BoundSocket::into_incoming;
        let (csi_incoming, csi_file) = listen(csi)?;
        let (registration_incoming, registration_file) = registration.map(listen).transpose()?.unzip();
        let csi_path = csi_file.path.clone();
        let registration_path = registration_file.as_ref().map(|f| f.path.clone());

        let (stop, stopped) = watch::channel(false);
        let signal = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let shared = Arc::new(tokio::sync::Mutex::new(core));
        let csi_server = Server::builder()
            .add_service(IdentityServer::new(IdentityService { config: config.clone(), backing }))
            .add_service(ControllerServer::new(ControllerService { core: shared.clone() }))
            .add_service(GroupControllerServer::new(GroupControllerService { core: shared.clone() }))
            .add_service(NodeServer::new(NodeService { core: shared }))
            .serve_with_incoming_shutdown(csi_incoming, signal(stopped.clone()));
        let csi_server = async { csi_server.await.map_err(|e| transport(&csi_path, e)) };
        let registrar =
            RegistrarService::new(plugin_info(&config.driver_name, &config.csi_socket), outcomes.clone());
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
        let registration_failed = async {
            let mut rx = outcomes.subscribe();
            let failure = if config.exit_on_registration_failure {
                rx.wait_for(|o| o.as_ref().is_some_and(|o| !o.registered))
                    .await
                    .ok()
                    .and_then(|o| o.as_ref().map(|o| o.error.clone()))
            } else {
                None
            };
            match failure {
                Some(error) => error,
                None => std::future::pending().await,
            }
        };
        tracing::info!(
            driver = %config.driver_name,
            socket = %config.csi_socket.display(),
            registration = ?registration_path,
            "serving"
        );

        let servers = async { tokio::try_join!(csi_server, registration_server) };
        tokio::pin!(servers, shutdown, registration_failed);
        let outcome = tokio::select! {
            result = &mut servers => {
                result?;
                let reason = "the servers stopped by themselves".to_string();
                return Err(CsiError::Driver { driver: config.driver_name.clone(), reason });
            }
            () = &mut shutdown => Ok(()),
            error = &mut registration_failed => Err(CsiError::Registration {
                socket: registration_path.clone().unwrap_or_default(),
                reason: format!("the kubelet did not register driver {}: {error}", config.driver_name),
            }),
        };
        let _ = stop.send(true);
        match tokio::time::timeout(DRAIN_TIMEOUT, &mut servers).await {
            Ok(result) => {
                result?;
            }
            Err(_) => tracing::warn!(
                driver = %config.driver_name,
                "connections still open after {DRAIN_TIMEOUT:?}; closing them"
            ),
        }
        drop(csi_file);
        drop(registration_file);
        tracing::info!(driver = %config.driver_name, "stopped; sockets removed");
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binding_replaces_stale_sockets_but_nothing_else_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/csi.sock");
        let first = bind_socket(&path).unwrap();
        drop(first.listener);
        // Nobody listens on the first socket any more: binding again replaces it.
        std::mem::forget(first.file);
        let second = bind_socket(&path).unwrap();
        assert!(second.file.is_ours());
        drop(second);
        assert!(!path.exists(), "dropping the guard removes the socket");

        std::fs::write(&path, "not a socket").unwrap();
        let err = bind_socket(&path).unwrap_err().to_string();
        assert!(err.contains("something other than a socket is there"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");
    }

    #[test]
    fn a_socket_file_replaced_by_something_else_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reg.sock");
        let bound = bind_socket(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "someone else's").unwrap();
        assert!(!bound.file.is_ours());
        drop(bound);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "someone else's");
    }
}
