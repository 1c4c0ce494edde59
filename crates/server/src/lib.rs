//! The cloud-web control plane as a library: [`start`] opens the state,
//! loads or creates the cluster CA, and serves the agent listener and the
//! user API until the returned [`RunningServer`] is dropped. `main.rs` only
//! parses flags and calls it; tests call it in-process with their own clock.
//!
//! This crate only composes the layers below (`cloudweb-core`,
//! `cloudweb-http`, `cloudweb-web`): it opens the state, binds the two
//! listeners and spawns the long-lived tasks. It must never hold domain
//! logic, SQL or route handlers of its own.

// The layers below, under the paths the tests and tools have always
// used (`cloudweb_server::config::Config`, `cloudweb_server::store`, ...).
pub use cloudweb_core::{
    access, acme, alerts, ca, clock, config, deploy, deployment_state, heartbeats, hub, live, log_archive, mesh_endpoint, registry,
    previews, registry_credentials, routes, runtime_logs, secrets, services, store, volumes, AppState, ADMIN_TOKEN_FILE,
};
pub use cloudweb_http::{agent_api, api, auth, error, git};
pub use cloudweb_web as web;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};

use cloudweb_protocol::{RegistryConfig, RouteTable};
use rand::Rng;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::ca::{sha256_hex, ClusterCa};
use crate::clock::Clock;
use crate::config::Config;
use crate::heartbeats::{flush_heartbeats, heartbeat_writer};
use crate::hub::Hub;
use crate::live::NodeRegistry;
use crate::store::Store;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot create data dir {path}: {source}")]
    DataDir { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Ca(#[from] ca::CaError),
    #[error(transparent)]
    Tls(#[from] agent_api::listener::TlsSetupError),
    #[error(transparent)]
    Secrets(#[from] secrets::SecretError),
    #[error(transparent)]
    Registry(#[from] registry::RegistryError),
    #[error(transparent)]
    SharedSecrets(#[from] cloudweb_core::shared_secrets::SharedSecretsError),
    #[error("cannot read the agent binary {path}: {source}")]
    AgentBinary { path: PathBuf, source: std::io::Error },
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    /// The database could not be opened; the text says why and what to do.
    #[error("{0}")]
    Database(String),
    #[error("{0}")]
    Git(String),
}

/// Opens the state database, refusing to start a new cluster over an old
/// one: a data dir that holds the cluster CA but an empty or missing
/// `state.db` lost its database (a full disk, a bad copy), and starting
/// fresh would forget every app and replace the admin token. Open errors
/// are explained in words an operator can act on.
async fn open_store(config: &Config, stamp: &str) -> Result<Store, StartError> {
    let data_dir = config.data_dir.as_path();
    if let Some(url @ store::DatabaseUrl::Postgres(_)) = &config.database_url {
        return Store::connect(url, data_dir, stamp)
            .await
            .map_err(|err| StartError::Database(format!("cannot open the PostgreSQL database {url}: {err}")));
    }
    let db = match &config.database_url {
        Some(store::DatabaseUrl::Sqlite(path)) => path.clone(),
        _ => data_dir.join(store::DATABASE_FILE),
    };
    let backups = data_dir.join("backups");
    let has_backup = std::fs::read_dir(&backups).is_ok_and(|entries| {
        entries.flatten().any(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("state-") && n.ends_with(".db")))
    });
    // Backups are written only before a schema migration, so a cluster
    // that never migrated has none: say so rather than point at an empty
    // or missing directory.
    let new_cluster = format!(
        "to give up this cluster's state instead and start a new cluster, move {} away (its apps, nodes and admin token are forgotten, and every node must join again)",
        data_dir.display()
    );
    let restore = if has_backup {
        format!(
            "restore the newest copy from {} (state-<time>.db, written before each schema migration) as {}; {new_cluster}",
            backups.display(),
            db.display()
        )
    } else {
        format!(
            "no backup exists in {} (one is written only before a schema migration); restore {} from a copy of your own if you have one; {new_cluster}",
            backups.display(),
            db.display()
        )
    };
    let has_cluster = data_dir.join(ca::CA_KEY_FILE).exists();
    let size = std::fs::metadata(&db).ok().map(|m| m.len());
    if has_cluster && size.unwrap_or(0) == 0 {
        let what = if size.is_some() { "is empty" } else { "is missing" };
        return Err(StartError::Database(format!(
            "{} {what}, but {} holds this cluster's CA and keys: refusing to start a new cluster over it; {restore}",
            db.display(),
            data_dir.display()
        )));
    }
    match Store::connect(&store::DatabaseUrl::Sqlite(db.clone()), data_dir, stamp).await {
        Ok(store) => Ok(store),
        Err(err) if err.is_disk_full() || disk_full(data_dir) => Err(StartError::Database(format!(
            "the disk holding {} is full, so the database cannot be opened ({err}); free some space and start again",
            data_dir.display()
        ))),
        Err(err) if err.is_corrupt() => Err(StartError::Database(format!(
            "{} is damaged or is not a cloud-web database ({err}); {restore}",
            db.display()
        ))),
        Err(err) => Err(StartError::Database(format!("cannot open {}: {err}", db.display()))),
    }
}

/// A start-up write that failed on a full disk, said in those words.
fn full_disk(err: StartError, data_dir: &std::path::Path) -> StartError {
    match err {
        StartError::Store(store) if store.is_disk_full() => StartError::Database(format!(
            "the disk holding {} is full, so the control plane cannot write its state ({store}); free some space and start again",
            data_dir.display()
        )),
        other => other,
    }
}

/// Whether the file system of `dir` has (next to) no space left for an
/// unprivileged writer.
// The casts matter where `statvfs` counts in 32 bits.
#[allow(clippy::unnecessary_cast)]
fn disk_full(dir: &std::path::Path) -> bool {
    nix::sys::statvfs::statvfs(dir).is_ok_and(|fs| (fs.blocks_available() as u64).saturating_mul(fs.fragment_size() as u64) < 64 * 1024)
}

/// A running control plane. Dropping it stops its tasks (tests rely on
/// this); [`RunningServer::shutdown`] also writes pending heartbeats.
pub struct RunningServer {
    pub agent_addr: SocketAddr,
    pub api_addr: SocketAddr,
    pub state: Arc<AppState>,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningServer {
    pub async fn shutdown(mut self) {
        let tasks: Vec<JoinHandle<()>> = self.tasks.drain(..).collect();
        for task in &tasks {
            task.abort();
        }
        // Wait until every task is really gone: dropping the registry's
        // supervisor is what kills the registry, and that must happen
        // before this process exits.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), futures_util::future::join_all(tasks)).await;
        flush_heartbeats(&self.state).await;
        if let Some(archive) = self.state.runtime_logs.archive() {
            archive.flush().await;
        }
        self.state.store.close().await;
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The control plane's state opened from its data dir, before anything
/// listens: what [`start`] serves, and what the simulator (`crates/sim`)
/// drives without sockets.
pub struct OpenedState {
    pub state: Arc<AppState>,
    tls: Arc<rustls::ServerConfig>,
    listener_cert: Arc<cloudweb_core::listener_cert::ListenerCert>,
}

pub async fn start(config: Config, clock: Arc<dyn Clock>) -> Result<RunningServer, StartError> {
    let OpenedState { state, tls, listener_cert } = open_state(config, clock).await?;
    serve(state, tls, listener_cert).await
}

/// Opens the database, the CA and the sealer, and builds the shared state,
/// with its route table computed. Starts no task and binds no socket.
pub async fn open_state(config: Config, clock: Arc<dyn Clock>) -> Result<OpenedState, StartError> {
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|source| StartError::DataDir { path: config.data_dir.clone(), source })?;
    let stamp = clock
        .now()
        .format(time::macros::format_description!("[year][month][day]T[hour][minute][second]Z"))
        .unwrap_or_else(|_| "unknown".to_string());
    let store = open_store(&config, &stamp).await?;
    let freed = store.release_unfinished_idempotency_keys().await.map_err(|e| full_disk(e.into(), &config.data_dir))?;
    if freed > 0 {
        tracing::info!(keys = freed, "freed Idempotency-Keys whose requests were cut off when the control plane last stopped");
    }
    let sealer = secrets::Sealer::load_or_create(&config.data_dir)?;
    if store.engine() == store::Engine::Postgres {
        // Every replica of this database presents the same CA and
        // listener key, so the agents' pins hold whichever one they reach.
        let shared = cloudweb_core::shared_secrets::share(&store, &sealer, &config.data_dir, &stamp, clock.now()).await?;
        if !shared.taken.is_empty() || !shared.offered.is_empty() {
            tracing::info!(from_database = ?shared.taken, stored = ?shared.offered, "cluster secrets shared through the database");
        }
    }
    let ca = ClusterCa::load_or_create(&config.data_dir, clock.now())?;
    let admin_tokens = ensure_admin_token(&config, &store, clock.as_ref()).await.map_err(|e| full_disk(e, &config.data_dir))?;
    let lost_hosts = store.sync_default_hosts(&config.base_domain).await.map_err(|e| full_disk(e.into(), &config.data_dir))?;
    for app in lost_hosts {
        tracing::warn!(app = %app, base_domain = %config.base_domain, "the app's default host is another app's custom domain; it answers only on its own domains");
    }

    let mut hosts = vec![config.public_url.host.clone()];
    for extra in ["localhost", "127.0.0.1"] {
        if !hosts.iter().any(|h| h == extra) {
            hosts.push(extra.to_string());
        }
    }
    let listener_lifetime = time::Duration::try_from(config.listener_cert_lifetime).unwrap_or(ca::LISTENER_CERT_VALIDITY);
    let (tls, listener_pin, listener_cert) = agent_api::listener::server_config(&ca, &config.data_dir, &hosts, clock.now(), listener_lifetime)?;
    let tls = Arc::new(tls);
    let agent_binary = match &config.agent_binary {
        Some(path) => {
            Some(cloudweb_core::AgentBinary::open(path).map_err(|source| StartError::AgentBinary { path: path.clone(), source })?)
        }
        None => None,
    };

    let registry_credentials = match &config.registry {
        Some(_) => Some(Arc::new(registry_credentials::Credentials::new(
            &config.data_dir.join("registry"),
            secrets::Sealer::load_or_create(&config.data_dir)?,
        ))),
        None => None,
    };
    let git_http = git::gitlab::http_client(config.gitlab_ca_file.as_deref()).map_err(StartError::Git)?;
    let gitlab_ca = match &config.gitlab_ca_file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| StartError::Git(format!("cannot read the GitLab CA file {}: {e}", path.display())))?;
            // Nodes get exactly the certificate blocks (git reads them).
            let pem = cloudweb_protocol::repo_ca::ca_certificates(&text, true)
                .map_err(|e| StartError::Git(format!("the GitLab CA file {}: {}", path.display(), e.problem)))?;
            Some(pem)
        }
        None => None,
    };
    let git_state = git::GitState::new(git_http, config.public_api_url.clone()).with_gitlab_ca(gitlab_ca);
    let state = Arc::new(AppState {
        store: store.clone(),
        ca,
        clock,
        nodes: NodeRegistry::default(),
        hub: Hub::default(),
        log_hub: Hub::default(),
        runtime_logs: runtime_logs::RuntimeLogs::default(),
        admin_tokens: RwLock::new(admin_tokens),
        routes: RwLock::new(RouteTable { version: 0, routes: Vec::new() }),
        route_index: routes::Index::default(),
        last_bodies: std::sync::Mutex::new(std::collections::HashMap::new()),
        waiting: std::sync::Mutex::new(std::collections::HashMap::new()),
        registry: RwLock::new(RegistryConfig::default()),
        registry_credentials,
        heartbeats_total: AtomicU64::new(0),
        leader: cloudweb_core::leader::Leadership::new(&config.public_url.to_string()),
        sealer,
        agent_binary,
        listener_pin,
        acme: acme::Acme::default(),
        git: git_state,
        auth: auth::AuthState::new(&config.auth, secrets::Sealer::load_or_create(&config.data_dir)?),
        sessions: Default::default(),
        access_cache: Default::default(),
        config,
    });
    // Runtime logs: kept in the log store (`logs.db` beside a SQLite
    // state), numbered above what it holds.
    let logs = store::LogStore::beside(&store, &state.config.data_dir, &stamp)
        .await
        .map_err(|err| StartError::Database(format!("cannot open the runtime-log store: {err}")))?;
    let stored_seq = logs.max_seq().await.map_err(|err| StartError::Database(format!("cannot read the runtime-log store: {err}")))?;
    state.runtime_logs.attach(cloudweb_core::log_archive::LogArchive::new(logs, state.config.logs.clone()), u64::try_from(stored_seq).unwrap_or(0));
    state.nodes.load(&store.nodes().await?, tokio::time::Instant::now());
    cloudweb_core::sessions::end_left_open(&state).await;
    // The login limits go on where the last run left them.
    let now_ms = state.clock.now_ms();
    state.auth.limiter.restore(store.login_attempts(now_ms - state.auth.limiter.window_ms()).await?, now_ms);
    // The first table exists before any node can connect, so a new
    // stream never sees a `routes` event for a table that did not change.
    routes::recompute(&state).await.map_err(|e| StartError::Database(format!("cannot compute the route table: {e:?}")))?;
    Ok(OpenedState { state, tls, listener_cert })
}

async fn serve(
    state: Arc<AppState>,
    tls: Arc<rustls::ServerConfig>,
    listener_cert: Arc<cloudweb_core::listener_cert::ListenerCert>,
) -> Result<RunningServer, StartError> {
    // What must run once in the cluster runs on the leader only. The
    // listeners open once the first claim of the lease was answered, so
    // agents are not turned away by a replica about to lead.
    let (first_claim, claimed) = tokio::sync::oneshot::channel();
    let leader = tokio::spawn(cloudweb_core::leader::run(
        state.clone(),
        vec![
            |state| Box::pin(deploy::reconciler(state)),
            |state| Box::pin(cloudweb_core::volume_moves::watcher(state)),
            |state| Box::pin(cloudweb_core::service_ops::watcher(state)),
            |state| Box::pin(cloudweb_core::backups::watcher(state)),
            |state| Box::pin(cloudweb_core::backups::control_plane::scheduler(state)),
            |state| Box::pin(cloudweb_core::tasks::watcher(state)),
            |state| Box::pin(cloudweb_core::autoscale::watcher(state)),
            |state| Box::pin(cloudweb_core::alerts::evaluator(state)),
            |state| Box::pin(cloudweb_core::alerts::delivery::deliverer(state)),
            |state| {
                Box::pin(async move {
                    if let Some(archive) = state.runtime_logs.archive() {
                        cloudweb_core::log_archive::retention::run(archive, state.clock.clone()).await;
                    }
                })
            },
            |state| Box::pin(acme::run(state)),
            |state| Box::pin(git::status_poster(state)),
            |state| Box::pin(git::refresher(state)),
            |state| Box::pin(cloudweb_core::previews::sweeper(state)),
        ],
        first_claim,
    ));
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), claimed).await;
    let agent_listener = bind(state.config.agent_listen).await?;
    let api_listener = bind(state.config.api_listen).await?;
    let agent_addr = agent_listener.local_addr().map_err(|source| StartError::Listen { addr: state.config.agent_listen, source })?;
    let api_addr = api_listener.local_addr().map_err(|source| StartError::Listen { addr: state.config.api_listen, source })?;

    let _ = state.git.public_api_url.set(format!("http://{api_addr}"));
    if let Some(settings) = state.config.gitlab.clone() {
        git::api::apply_settings(&state, settings).await.map_err(|e| StartError::Git(format!("--gitlab-* flags: {e}")))?;
    }

    // On PostgreSQL, what the hubs are told reaches the other replicas.
    let mut tasks = vec![leader, tokio::spawn(cloudweb_core::event_relay::run(state.clone()))];
    if let Some(shipping) = cloudweb_core::access::audit::start_forwarding(&state) {
        tasks.push(tokio::spawn(shipping));
    }
    if let Some(archive) = state.runtime_logs.archive() {
        if let Some(shipping) = archive.start_forwarding() {
            tasks.push(tokio::spawn(shipping));
        }
        tasks.push(tokio::spawn(archive.writer()));
    }
    tokio::task::spawn_blocking(auth::users::warm_up);
    if let (Some(settings), Some(credentials)) = (state.config.registry.clone(), state.registry_credentials.clone()) {
        if registry::listen_address_present(settings.listen) {
            let registered: HashSet<String> = state.nodes.all().into_iter().map(|n| n.id).collect();
            let running = registry::start(&settings, &state.config.data_dir, &state.ca, &credentials, &registered, state.clock.now()).await?;
            *state.registry.write().expect("registry lock") = running.agent_config.clone();
            tasks.push(tokio::spawn(registry::supervise(running, credentials, state.clone())));
        } else {
            // Listening only on the mesh: the address comes with this
            // host's agent, which joins through this control plane, so the
            // registry starts once it is there. Agents learn the address
            // now; pushes and pulls retry until it answers.
            *state.registry.write().expect("registry lock") = registry::agent_config(&settings, &state.ca);
            tasks.push(tokio::spawn(deferred_registry(state.clone(), settings, credentials)));
        }
    }

    let agent_router = agent_api::router(state.clone());
    // The dashboard's pages share the listener but not the API's route list
    // (they are HTML, not in the OpenAPI document), so they are merged here.
    let api_router = web::router(state.clone())
        .layer(axum::middleware::from_fn(api::run_to_completion))
        .layer(axum::extract::DefaultBodyLimit::max(error::MAX_BODY_BYTES))
        .with_state(state.clone())
        .merge(api::router_with_pages(
            state.clone(),
            Some(|state, request| {
                Box::pin(web::not_found_page(axum::extract::State(state), request))
            }),
        ));
    tasks.extend([
        tokio::spawn(agent_api::listener::serve(agent_listener, tls, agent_router, state.config.agent_connections.clone(), listener_cert.renewals())),
        tokio::spawn(cloudweb_core::listener_cert::renew(state.clone(), listener_cert)),
        tokio::spawn(api::listener::serve(api_listener, api_router, api_limits(&state.config.api_connections))),
        tokio::spawn(heartbeat_writer(state.clone())),
    ]);
    tracing::info!(%agent_addr, %api_addr, ca_sha256 = %state.ca.fingerprint(), "control plane listening");
    Ok(RunningServer { agent_addr, api_addr, state, tasks })
}

/// Starts the registry once its listen address exists, then supervises it.
/// A start that fails is tried again a minute later.
async fn deferred_registry(state: Arc<AppState>, settings: registry::RegistrySettings, credentials: Arc<registry_credentials::Credentials>) {
    loop {
        registry::wait_for_listen_address(settings.listen).await;
        let registered: HashSet<String> = state.nodes.all().into_iter().map(|n| n.id).collect();
        match registry::start(&settings, &state.config.data_dir, &state.ca, &credentials, &registered, state.clock.now()).await {
            Ok(running) => return registry::supervise(running, credentials, state).await,
            Err(err) => {
                tracing::error!(error = %err, "the image registry could not start; trying again in 60 s");
                tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            }
        }
    }
}

/// The user API's limits, its total kept to half the open file limit: the
/// other half is the reserve that keeps the agent listener (nodes, their
/// streams), the database and the registry able to open descriptors
/// whatever the user API's port is sent.
fn api_limits(configured: &config::ApiConnectionLimits) -> config::ApiConnectionLimits {
    let mut limits = configured.clone();
    if let Ok((soft, _)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) {
        let budget = usize::try_from(soft / 2).unwrap_or(usize::MAX).max(1);
        if limits.max_total > budget {
            tracing::warn!(configured = limits.max_total, open_file_limit = soft, used = budget, "the user API's connection cap is above half the open file limit; using half");
            limits.max_total = budget;
        }
    }
    limits.max_per_address = limits.max_per_address.min(limits.max_total);
    limits
}

/// Listens on `addr` with a backlog of 4,096 (the kernel caps it at
/// `net.core.somaxconn`) rather than tokio's 1,024: under a flood of
/// connections the accept queue fills between two accepts, and a
/// connection dropped from a full queue waits for the kernel's retries
/// (seconds), whoever it is from.
async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    let listen = || {
        let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(4096)
    };
    listen().map_err(|source| StartError::Listen { addr, source })
}

/// Creates the first admin token when there is none, writing it to
/// `<data-dir>/admin-token` (mode 0600). Returns the digests of all tokens.
async fn ensure_admin_token(config: &Config, store: &Store, clock: &dyn Clock) -> Result<HashSet<String>, StartError> {
    let mut digests: HashSet<String> = store.admin_token_digests().await?.into_iter().collect();
    if digests.is_empty() {
        let bytes: [u8; 32] = rand::rng().random();
        let token = format!("cwa_{}", hex::encode(bytes));
        let path = config.data_dir.join(ADMIN_TOKEN_FILE);
        // A file left from an earlier, since-deleted database is stale.
        let _ = std::fs::remove_file(&path);
        ca::write_private(&path, format!("{token}\n").as_bytes())?;
        let digest = sha256_hex(token.as_bytes());
        store.insert_admin_token(&digest, clock.now_ms()).await?;
        tracing::info!(path = %path.display(), "wrote the initial admin API token");
        digests.insert(digest);
    }
    Ok(digests)
}
