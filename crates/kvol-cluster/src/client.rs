//! The API client: from a kubeconfig file, or as kube-rs infers it (`KUBECONFIG`, `~/.kube/config`, or the pod's service account in a cluster).

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Why cluster mode cannot reach the API.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot read kubeconfig {path}: {source}")]
    Kubeconfig { path: PathBuf, source: kube::config::KubeconfigError },
    #[error("cannot find an api server configuration (no kubeconfig, not in a pod): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    #[error("cannot build the api client: {0}")]
    Build(#[from] kube::Error),
}

/// What kvol's requests say they come from: the API server names the field manager of kvol's
/// updates after it (`kvol`, where a client that says nothing is `unknown`).
pub const USER_AGENT: &str = concat!("kvol/", env!("CARGO_PKG_VERSION"));

/// A client for the API server `kubeconfig` names, or the inferred one when `None`.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, ClientError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|source| ClientError::Kubeconfig { path: path.to_path_buf(), source })?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|source| ClientError::Kubeconfig { path: path.to_path_buf(), source })?
        }
        None => Config::infer().await?,
    };
    config.headers.push((http::header::USER_AGENT, http::HeaderValue::from_static(USER_AGENT)));
    Ok(Client::try_from(config)?)
}
