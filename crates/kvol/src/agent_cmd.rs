//! `kvol agent`: the node agent, on kubelet's directories (or one scratch root) and its manifests.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use kvol_api::{FeatureGates, StorageSection};
use kvol_components::{Catalogue, NodeFacts};
use kvol_components_runtime::components::{ComponentPaths, ComponentsSetup};
use kvol_node::AgentConfig;
use kvol_node::agent::{run_agent, run_agent_with_source};
use kvol_node::report::status::{Phase, read_status, render_table};
use kvol_node::sources::{ManifestsSource, ObjectSource};

use crate::embedded_runtime;

/// Arguments of `kvol agent`.
#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// Kubelet's root directory, laid out as kubelet lays it out: `pods/`, `plugins/`,
    /// `plugins_registry/` (where CSI drivers register).
    #[arg(long, default_value = kvol_plugin::host::DEFAULT_ROOT_DIR)]
    pub root_dir: PathBuf,
    /// The Flexvolume driver directory (kubelet's `--volume-plugin-dir`).
    #[arg(long, default_value = kvol_flex::install::DEFAULT_PLUGIN_DIR)]
    pub volume_plugin_dir: PathBuf,
    /// kvol's own files: journal (`state.redb`), `status.json`, the bundled driver's volumes.
    #[arg(long, default_value = crate::components_common::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// One scratch root for everything (demos, tests): the same as `--state-dir <root>
    /// --root-dir <root>/kubelet --volume-plugin-dir <root>/flexvolume`.
    #[arg(long, conflicts_with_all = ["root_dir", "volume_plugin_dir", "state_dir"])]
    pub root: Option<PathBuf>,
    /// The manifests directory (Pods, PersistentVolumes, claims, StorageClasses, CSIDrivers,
    /// Secrets); defaults to `<state-dir>/manifests`. Watched: changes apply at once.
    #[arg(long)]
    pub manifests: Option<PathBuf>,
    /// Cluster mode: the API server this kubeconfig names is the source of pods (those bound
    /// to this node) and of the objects they reference, and receives the node's CSINode,
    /// node-ID annotation and volumes in use. `--manifests`, when given, adds static pods.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// kubelet's TLS bootstrap: when the `--kubeconfig` file is missing or its client
    /// certificate unusable (none, unreadable, expired), this kubeconfig (a bootstrap token)
    /// asks for the node's client certificate (a CertificateSigningRequest for
    /// `kubernetes.io/kube-apiserver-client-kubelet`, waited for until approved and signed),
    /// which is kept in `--cert-dir`, and `--kubeconfig` is written to use it.
    #[arg(long, value_name = "FILE", requires = "kubeconfig")]
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// Where the node's client certificate and its key are kept (kubelet's flag:
    /// `kubelet-client-current.pem`); default `<root-dir>/pki`.
    #[arg(long, value_name = "DIR")]
    pub cert_dir: Option<PathBuf>,
    /// Rotate the client certificate the bootstrap got (kubelet's flag): at 70–90 % of its
    /// life a new key and request, made with the node's own credentials; once it is signed kvol
    /// starts itself again (the same process, exec) on the new certificate, adopting the node's
    /// pods and volumes as any restart does.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true",
        action = clap::ArgAction::Set, value_name = "BOOL", requires = "bootstrap_kubeconfig")]
    pub rotate_certificates: bool,
    /// Cluster mode with the configuration kube-rs infers: `KUBECONFIG`, `~/.kube/config`,
    /// or the pod's service account when run in a pod.
    #[arg(long)]
    pub cluster: bool,
    /// The node's name; defaults to the host name.
    #[arg(long, env = "KVOL_NODE_NAME")]
    pub node_name: Option<String>,
    /// Serve Prometheus metrics on this address (`/metrics`).
    #[arg(long, default_value = "127.0.0.1:9809")]
    pub metrics_address: SocketAddr,
    /// Do not serve metrics.
    #[arg(long)]
    pub no_metrics: bool,
    /// Do not serve the runtime API (`<state-dir>/runtime.sock`, for whatever runs the pods'
    /// containers; see docs/runtime-api.md).
    #[arg(long)]
    pub no_runtime_api: bool,
    /// Run no storage components (the bundled CSI driver hostpath.csi.kvol.io among them),
    /// whatever the config's `storage` section says.
    #[arg(long, alias = "no-bundled-driver")]
    pub no_components: bool,
    /// The longest wait before a storage component that keeps crashing is started again (the
    /// wait starts at 500 ms and doubles with each crash in a row; a run of a minute resets it).
    #[arg(long, default_value = "30", value_name = "SECONDS")]
    pub component_restart_backoff_max_seconds: u64,
    /// Directory of user component definitions (*.yaml) beside the built-in ones.
    #[arg(long, default_value = crate::components_common::DEFAULT_DEFINITIONS_DIR)]
    pub component_definitions_dir: PathBuf,
    /// Do not install the example Flexvolume drivers.
    #[arg(long)]
    pub no_example_flex_drivers: bool,
    /// How often published volumes are checked against the mount table.
    #[arg(long, default_value = "10", value_name = "SECONDS")]
    pub resync_seconds: u64,
    /// How often a volume whose CSI driver says `requiresRepublish` is published again.
    #[arg(long, default_value = "60", value_name = "SECONDS")]
    pub republish_seconds: u64,
    /// How often the volumes of claims are measured for the `kubelet_volume_stats_*` metrics
    /// (kubelet's flag and default; a Go duration such as `1m0s`, `30s`; `0` turns it off).
    #[arg(long, default_value = "1m0s", value_name = "DURATION", value_parser = kvol_api::go_duration::parse_go_duration)]
    pub volume_stats_agg_period: Duration,
    /// The deadline of every call to a CSI driver; a call cut short by it leaves its volume
    /// uncertain (torn down like a finished one, or tried again).
    #[arg(long, default_value = "120", value_name = "SECONDS")]
    pub csi_call_timeout_seconds: u64,
    /// Allow hostPath volumes only at or under these absolute paths (comma-separated, matched
    /// by whole components: `/srv` allows `/srv/a`, not `/srv2`). Unset: anywhere, as kubelet.
    #[arg(long, value_delimiter = ',', value_name = "PREFIX,...")]
    pub allowed_host_paths: Option<Vec<PathBuf>>,
    /// Exit once every volume has settled (published, failed with a reason, or pending with a
    /// reason) and print the status: a demonstration mode. Volumes stay mounted.
    #[arg(long)]
    pub until_settled: bool,
    /// Run the pods' containers through this CRI runtime (kubelet's flag), e.g.
    /// `unix:///run/containerd/containerd.sock`; without it kvol sets up volumes only.
    /// `embedded`: a private containerd under the state directory, with the example image
    /// `kvol.local/busybox:1` made from the host's static busybox (volumes only, saying why,
    /// where that cannot run); with --until-settled its pods are removed before the exit.
    #[arg(long, value_name = "unix://PATH")]
    pub container_runtime_endpoint: Option<String>,
    /// In cluster mode with a container runtime: register the Node and keep its Lease and
    /// status as kubelet does (kubelet's flag); false leaves the Node to whoever made it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub register_node: bool,
    /// The pods the node takes (kubelet's `--max-pods`): in its Node's capacity, and counted
    /// when a pod is admitted.
    #[arg(long, default_value = "110")]
    pub max_pods: u32,
    /// Resources held back for the system and for kvol itself (kubelet's flags:
    /// `cpu=100m,memory=256Mi,ephemeral-storage=1Gi`), taken from the node's allocatable.
    #[arg(long, default_value = "", value_name = "RESOURCES")]
    pub system_reserved: String,
    #[arg(long, default_value = "", value_name = "RESOURCES")]
    pub kube_reserved: String,
    /// Hard eviction thresholds (kubelet's flag and default): taken from the allocatable, and
    /// the node under memory or disk pressure while what is available is under them.
    #[arg(long, default_value = kvol_api::allocatable::DEFAULT_EVICTION_HARD, value_name = "THRESHOLDS")]
    pub eviction_hard: String,
    /// kubelet's API (containerLogs, healthz) for the API server, in cluster mode with a
    /// container runtime: its port (0: not served) and address.
    #[arg(long, default_value = "10250")]
    pub port: u16,
    #[arg(long, default_value = "0.0.0.0")]
    pub address: std::net::IpAddr,
    /// The kubelet API's serving certificate and key (PEM); without them a self-signed one.
    #[arg(long, requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    #[arg(long, requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// Clients of the kubelet API may show a certificate this CA signed (the API server's
    /// `--kubelet-client-certificate`); its subject is the caller.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// Callers of the kubelet API may show a bearer token, which the API server's TokenReview
    /// turns into a user (kubelet's flag).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub authentication_token_webhook: bool,
    /// What kubelet API callers may do: `Webhook` (a SubjectAccessReview of `nodes/proxy`,
    /// `nodes/log`, `nodes/metrics`, `nodes/stats` per request) or `AlwaysAllow`.
    #[arg(long, default_value = "Webhook", value_name = "MODE")]
    pub authorization_mode: kvol_kubelet_api::auth::Authorization,
    /// With --until-settled: give up (exit 1) after this long.
    #[arg(long, default_value = "120", value_name = "SECONDS")]
    pub settle_timeout_seconds: u64,
}

/// The agent's directories from the flags: `--root` alone, or the kubelet-style three.
pub fn base_config(args: &AgentArgs, node_name: String) -> AgentConfig {
    match &args.root {
        Some(root) => AgentConfig::embedded(root, node_name),
        None => {
            AgentConfig::kubelet_layout(&args.root_dir, &args.volume_plugin_dir, &args.state_dir, node_name)
        }
    }
}

/// The storage components' setup: the config's section, the definitions, what the node has,
/// and where component processes keep their files. The embedded default (`--root`) is
/// self-contained: it does not ask the node's volume groups, so its default driver is the
/// bundled one.
fn components_setup(
    args: &AgentArgs,
    config: &AgentConfig,
    storage: &StorageSection,
    config_file: Option<&Path>,
) -> anyhow::Result<ComponentsSetup> {
    let (catalogue, problems) = Catalogue::load(&args.component_definitions_dir);
    for problem in &problems {
        tracing::warn!(%problem, "component definition left out");
    }
    let facts =
        if args.root.is_some() { NodeFacts::default() } else { crate::components_common::node_facts() };
    let kvol_binary = std::env::current_exe().context("cannot tell where the kvol binary is")?;
    let config_dir = config_file
        .and_then(Path::parent)
        .map_or_else(|| PathBuf::from(DEFAULT_CONFIG_DIR), Path::to_path_buf);
    Ok(ComponentsSetup {
        storage: storage.clone(),
        catalogue,
        facts,
        paths: ComponentPaths {
            kvol_binary,
            node_name: config.node_name.clone(),
            root_dir: config.root_dir.clone(),
            state_dir: config.state_dir.clone(),
            config_dir,
        },
    })
}

/// Where components' own config files are when kvol has no config file (`{config}`).
const DEFAULT_CONFIG_DIR: &str = "/etc/kvol";

pub fn run(
    gates: &FeatureGates,
    storage: &StorageSection,
    config_file: Option<&Path>,
    args: &AgentArgs,
    node_name: String,
) -> anyhow::Result<ExitCode> {
    let mut config = base_config(args, node_name);
    config.gates = gates.clone();
    if let Some(dir) = &args.manifests {
        config.manifests_dir = dir.clone();
    }
    if !args.no_components {
        config.components = Some(components_setup(args, &config, storage, config_file)?);
        config.config_file = config_file.map(Path::to_path_buf);
    }
    config.example_flex_drivers = !args.no_example_flex_drivers;
    config.metrics_address = (!args.no_metrics).then_some(args.metrics_address);
    if args.no_runtime_api {
        config.runtime_socket = None;
    }
    let budget =
        crate::node_facts::Budget::of_flags(&args.system_reserved, &args.kube_reserved, &args.eviction_hard)?;
    let embedded = args.container_runtime_endpoint.as_deref() == Some(embedded_runtime::EMBEDDED);
    let endpoint = match args.container_runtime_endpoint.as_deref() {
        Some(embedded_runtime::EMBEDDED) => match embedded_runtime::unavailable() {
            None => Some(embedded_runtime::endpoint_in(&config.state_dir)),
            Some(why) => {
                tracing::warn!(%why, "volumes only: the embedded container runtime cannot run here");
                crate::runner_cmd::record_volumes_only(&config.state_dir, &why);
                None
            }
        },
        other => other.map(str::to_string),
    };
    let runner = match &endpoint {
        Some(endpoint) => Some(crate::runner_cmd::prepare(
            endpoint,
            args.root.is_some(),
            (args.max_pods, budget.allocatable(&config.state_dir)),
            &mut config,
        )?),
        None => None,
    };
    let private_runtime = embedded && endpoint.is_some();
    let with_pods = runner.is_some();
    config.resync = Duration::from_secs(args.resync_seconds.max(1));
    config.republish = Duration::from_secs(args.republish_seconds.max(1));
    config.csi_call_timeout = Duration::from_secs(args.csi_call_timeout_seconds.max(1));
    config.component_restart_backoff_max =
        Duration::from_secs(args.component_restart_backoff_max_seconds.max(1));
    config.volume_stats_period = args.volume_stats_agg_period;
    if let Some(prefixes) = &args.allowed_host_paths {
        if let Some(bad) = prefixes.iter().find(|p| !p.is_absolute()) {
            anyhow::bail!("--allowed-host-paths: {} is not an absolute path", bad.display());
        }
        config.allowed_host_paths = Some(prefixes.clone());
    }
    // Blocking calls (provisioned records' fsyncs, volume measurements, Flexvolume probes) go
    // through `kvol_plugin::blocking`, a few at a time; their threads end soon after a burst.
    // tokio's own cap stays (512): a call stuck on a dead mount keeps its thread for good.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_keep_alive(Duration::from_secs(1))
        .build()
        .context("cannot start the async runtime")?;
    let root = config.state_dir.clone();
    let register = match (&endpoint, args.register_node) {
        (Some(endpoint), true) => Some((endpoint.clone(), args.max_pods, budget.clone())),
        _ => None,
    };
    let kubelet_api = match (&runner, args.port) {
        (Some(runner), port) if port != 0 => Some(kvol_kubelet_api::KubeletApiConfig {
            address: std::net::SocketAddr::new(args.address, port),
            tls_files: args.tls_cert_file.clone().zip(args.tls_private_key_file.clone()),
            client_ca: args.client_ca_file.clone(),
            // The reviews are the API server's, set once the cluster is reached.
            access: kvol_kubelet_api::auth::Access::new(
                None,
                args.authentication_token_webhook,
                args.authorization_mode,
            ),
            metrics_address: (!args.no_metrics).then_some(args.metrics_address),
            node_name: config.node_name.clone(),
            runner_dir: runner.runner_dir(),
            log_root: runner.log_root(),
        }),
        _ => None,
    };
    let bootstrap = args.bootstrap_kubeconfig.clone().zip(args.kubeconfig.clone()).map(|(from, to)| {
        kvol_cluster::bootstrap::Bootstrap {
            bootstrap_kubeconfig: from,
            kubeconfig: to,
            // Absolute: the kubeconfig written names the certificate by this path.
            cert_dir: std::path::absolute(
                args.cert_dir.clone().unwrap_or_else(|| config.root_dir.join("pki")),
            )
            .unwrap_or_default(),
            node: config.node_name.clone(),
            timeout: kvol_cluster::bootstrap::ANSWER_TIMEOUT,
        }
    });
    let cluster = (args.cluster || args.kubeconfig.is_some()).then(|| ClusterMode {
        kubeconfig: args.kubeconfig.clone(),
        bootstrap,
        rotate: args.rotate_certificates,
        static_pods: args.manifests.clone(),
        register,
        kubelet_api,
    });
    let settle = args.until_settled.then(|| Duration::from_secs(args.settle_timeout_seconds));
    // Set when a rotated client certificate asks for a start again on it.
    let again = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let again_set = again.clone();
    let outcome = runtime.block_on(async move {
        // Settled: whether, and the pods as they were then (before the agent stops under them).
        let (settled_tx, settled_rx) = tokio::sync::oneshot::channel::<(bool, String)>();
        if let Some(limit) = settle {
            let root = root.clone();
            tokio::spawn(async move {
                let ok = wait_until_settled(&root, limit, with_pods).await;
                let pods = read_status(&root)
                    .map(|report| crate::status_cmd::pods_with_logs(&root, &report))
                    .unwrap_or_default();
                let _ = settled_tx.send((ok, pods));
            });
        } else {
            drop(settled_tx);
        }
        let containerd = match private_runtime {
            true => Some(embedded_runtime::EmbeddedRuntime::start(&root).await?),
            false => None,
        };
        let mut runner = runner.map(crate::runner_cmd::RunnerSetup::start).transpose()?;
        let reports = runner.as_mut().and_then(|r| r.reports.take());
        let taints = runner.as_ref().map(|r| r.taints.clone());
        let mut settled = None;
        let (rotated_tx, rotated_rx) = tokio::sync::oneshot::channel::<String>();
        let shutdown = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("a SIGTERM handler");
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM"),
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
                outcome = settled_rx, if settle.is_some() => settled = outcome.ok(),
                Ok(request) = rotated_rx => {
                    tracing::info!(request, "starting again with the rotated client certificate");
                    again_set.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }
        };
        match cluster {
            Some(mode) => {
                let parts = mode.start(&mut config, reports, taints, rotated_tx).await?;
                run_agent_with_source(config, parts.source, shutdown).await.map_err(anyhow::Error::msg)?;
                if let Some(keeper) = parts.keeper {
                    keeper.stop().await;
                }
                if let Some(writer) = parts.writer {
                    writer.stop();
                }
                if let Some(mirrors) = parts.mirrors {
                    mirrors.stop();
                }
                for task in [parts.taints, parts.rotation].into_iter().flatten() {
                    task.abort();
                }
                let _ = parts.kubelet_api_stop.send(true);
            }
            None => run_agent(config, shutdown).await.map_err(anyhow::Error::msg)?,
        }
        if let Some(runner) = runner {
            let _ = runner.stop.send(true);
        }
        let outcome = match settled {
            Some((ok, pods)) => {
                let report = read_status(&root).map_err(anyhow::Error::msg)?;
                print!("{}", render_table(&report, now_ms()));
                print!("{pods}");
                Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
            }
            None => Ok(ExitCode::SUCCESS),
        };
        match (containerd, settle) {
            (Some(containerd), Some(_)) => containerd.stop_leaving_nothing().await,
            (Some(containerd), None) => containerd.stop().await,
            (None, _) => {}
        }
        outcome
    });
    if again.load(std::sync::atomic::Ordering::SeqCst) {
        // The runtime is not dropped first: that would wait for blocking calls (one stuck on a
        // dead mount never returns); the exec ends every thread.
        return Err(start_again());
    }
    outcome
}

/// Replaces this process by kvol run again with the same arguments (it returns only the
/// error of a failed exec).
fn start_again() -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    let error = std::process::Command::new("/proc/self/exe").arg0(argv0).args(args).exec();
    anyhow::anyhow!("cannot start again on the rotated client certificate: {error}")
}

/// What cluster mode runs: the object source, and when kvol runs the node's pods the Node's
/// keeper, the pods' status writer and kubelet's API (stopped by `kubelet_api_stop`).
struct ClusterParts {
    source: Box<dyn ObjectSource>,
    keeper: Option<kvol_cluster::node_registration::NodeKeeper>,
    writer: Option<kvol_cluster::pod_status::PodStatusWriter>,
    /// The static pods' mirror pods, kept when kvol keeps the Node.
    mirrors: Option<kvol_cluster::mirror_pods::MirrorKeeper>,
    /// The Node's taints followed for the runner's admission, when kvol keeps the Node.
    taints: Option<tokio::task::JoinHandle<()>>,
    /// The client certificate's rotation (`--rotate-certificates`).
    rotation: Option<tokio::task::JoinHandle<()>>,
    kubelet_api_stop: tokio::sync::watch::Sender<bool>,
}

/// How cluster mode was asked for.
struct ClusterMode {
    kubeconfig: Option<PathBuf>,
    /// kubelet's TLS bootstrap, to make the kubeconfig's credentials first when needed.
    bootstrap: Option<kvol_cluster::bootstrap::Bootstrap>,
    /// Rotate the bootstrap's client certificate.
    rotate: bool,
    /// A manifests directory beside the API, for static pods.
    static_pods: Option<PathBuf>,
    /// Register the Node (the runtime's endpoint, `--max-pods`, what the node holds back):
    /// kvol runs the node's pods.
    register: Option<(String, u32, crate::node_facts::Budget)>,
    /// kubelet's API, served once the Node is kept.
    kubelet_api: Option<kvol_kubelet_api::KubeletApiConfig>,
}

impl ClusterMode {
    /// Connects to the API, waits for the node's pods, and sets `config` for cluster mode:
    /// no claim provisioning (the cluster's provisioner does it), the node's storage objects
    /// written to the API.
    async fn start(
        self,
        config: &mut AgentConfig,
        reports: Option<tokio::sync::mpsc::UnboundedReceiver<kvol_api::pod::PodReport>>,
        taints: Option<tokio::sync::watch::Sender<Vec<k8s_openapi::api::core::v1::Taint>>>,
        rotated: tokio::sync::oneshot::Sender<String>,
    ) -> anyhow::Result<ClusterParts> {
        if let Some(bootstrap) = &self.bootstrap {
            let started = Instant::now();
            let joined = kvol_cluster::bootstrap::ensure(bootstrap).await?;
            tracing::info!(node = %bootstrap.node, ?joined, ms = started.elapsed().as_millis() as u64, "node credentials");
        }
        let client = kvol_cluster::client::client(self.kubeconfig.as_deref()).await?;
        let rotation = match (&self.bootstrap, self.rotate) {
            (Some(b), true) => {
                Some(kvol_cluster::bootstrap::keep_rotating(client.clone(), b.clone(), rotated))
            }
            _ => None,
        };
        let node = config.node_name.clone();
        let facts = self.facts(&node, &config.state_dir).await;
        let keeper = kvol_cluster::node_registration::take_node(client.clone(), &node, facts)
            .await
            .map_err(anyhow::Error::msg)?;
        // The taints first: the runner admits the pods the source is about to give it.
        let taints = match taints.filter(|_| keeper.is_some()) {
            Some(tx) => Some(kvol_cluster::node_taints::follow(client.clone(), &node, tx).await),
            None => None,
        };
        tracing::info!(node, "cluster mode: waiting for the node's pods from the api server");
        let api = kvol_cluster::source::ApiSource::start(client.clone(), &node).await;
        config.provision_claims = false;
        config.attachments =
            Some(std::sync::Arc::new(kvol_cluster::attachments::ApiAttachments::new(client.clone())));
        config.tokens = Some(std::sync::Arc::new(kvol_cluster::tokens::ApiTokens::new(client.clone())));
        let events = std::sync::Arc::new(kvol_cluster::events::ApiNodeEvents::new(client.clone()));
        let recovery = config.gates.enabled(kvol_api::gates::Gate::RecoverVolumeExpansionFailure);
        config.claim_status = Some(std::sync::Arc::new(kvol_cluster::claims::ClaimStatusWriter::new(
            client.clone(),
            node.clone(),
            recovery,
            events.clone(),
        )));
        config.pod_events =
            Some(std::sync::Arc::new(kvol_cluster::events::EventWriter::start(node.clone(), events)));
        let objects = std::sync::Arc::new(kvol_cluster::node_objects::ApiNodeObjects::new(client.clone()));
        config.node_storage =
            Some(std::sync::Arc::new(kvol_cluster::node_objects::NodeWriter::start(node.clone(), objects)));
        let has_static_pods = self.static_pods.is_some();
        let source: Box<dyn ObjectSource> = match self.static_pods {
            Some(dir) => {
                let manifests = ManifestsSource::start(dir.clone())
                    .with_context(|| format!("cannot watch the static pods in {}", dir.display()))?;
                let merged = kvol_cluster::merged::MergedSource::start(
                    Box::new(api),
                    Box::new(manifests),
                    node.clone(),
                );
                Box::new(merged)
            }
            None => Box::new(api),
        };
        let mirrors = (keeper.is_some() && has_static_pods).then(|| {
            kvol_cluster::mirror_pods::MirrorKeeper::start(client.clone(), node.clone(), source.subscribe())
        });
        // The pods' status is kvol's to write when it keeps the Node (it runs them).
        let writer = reports.filter(|_| keeper.is_some()).map(|r| {
            kvol_cluster::pod_status::PodStatusWriter::start(client.clone(), config.node_name.clone(), r)
        });
        let (kubelet_api_stop, stopped) = tokio::sync::watch::channel(false);
        if let Some(mut api) = self.kubelet_api.filter(|_| keeper.is_some()) {
            let reviews = std::sync::Arc::new(kvol_kubelet_api::reviews::ApiReviews::new(client.clone()));
            api.access = kvol_kubelet_api::auth::Access::new(
                Some(reviews),
                api.access.token_webhook,
                api.access.authorization,
            );
            tokio::spawn(async move {
                if let Err(e) = kvol_kubelet_api::serve(api, stopped).await {
                    tracing::error!(error = %e, "kubelet api not served");
                }
            });
        }
        Ok(ClusterParts { source, keeper, writer, mirrors, taints, rotation, kubelet_api_stop })
    }

    /// The node's facts when kvol registers it (it runs the node's pods).
    async fn facts(
        &self,
        node: &str,
        state_dir: &Path,
    ) -> Option<kvol_cluster::node_registration::NodeFacts> {
        let (endpoint, max_pods, budget) = self.register.as_ref()?;
        let mut facts = crate::node_facts::gather(node, endpoint, *max_pods, budget, state_dir).await;
        facts.kubelet_port = self.kubelet_api.as_ref().map_or(0, |api| api.address.port());
        Some(facts)
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Waits until the status has volumes and none of them is in a transitional phase, and (with
/// `pods`) every pod's containers have started or say why not, all unchanged for two seconds;
/// false on timeout.
async fn wait_until_settled(root: &std::path::Path, limit: Duration, pods: bool) -> bool {
    let start = Instant::now();
    let mut last: Option<(Vec<(String, String)>, Instant)> = None;
    while start.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let Ok(report) = read_status(root) else { continue };
        if report.pid != std::process::id() || report.volumes.is_empty() {
            continue;
        }
        let mut phases: Vec<(String, String)> = report
            .volumes
            .iter()
            .map(|v| (format!("{}/{}", v.pod, v.volume), format!("{:?}", v.phase)))
            .collect();
        let mut steady = report.volumes.iter().all(|v| {
            matches!(
                v.phase,
                Phase::Published | Phase::Uncertain | Phase::Failed | Phase::Pending | Phase::Unused
            )
        });
        if pods {
            let Some(states) = crate::status_cmd::pod_states(root, &report) else { continue };
            steady &= states.iter().all(|(_, state)| state.1);
            phases.extend(states.into_iter().map(|(name, state)| (name, state.0)));
        }
        match &last {
            Some((previous, since)) if *previous == phases && steady => {
                if since.elapsed() >= Duration::from_secs(2) {
                    return true;
                }
            }
            _ => last = Some((phases, Instant::now())),
        }
    }
    false
}
