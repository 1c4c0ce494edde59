//! Exec and port-forward sessions (see `cloudweb_protocol::sessions`): a
//! user's request picks an instance, the record and the node's
//! `session_open` command are written together, and the node's dial-back
//! is handed to the request that waits for it. The bridge between the
//! user's WebSocket and the dial-back is the API layer's; what it ends
//! with is recorded here.
//!
//! A replica holds the user side of its own sessions in memory (the
//! waiting requests, the counts behind the limits): a session's node
//! dials back to the replica named in its command, whichever replica the
//! node reads commands from.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_protocol::sessions::{SessionOpenPayload, SessionTarget};
use cloudweb_protocol::CommandKind;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;

use crate::store::exec_sessions::{ExecSessionRow, SessionEnd};
use crate::{store, ApiError, AppState};

/// Limits and timeouts of sessions.
#[derive(Debug, Clone)]
pub struct SessionSettings {
    /// A session with no byte either way for this long is closed.
    pub idle_timeout: Duration,
    /// Sessions one user (or the admin token) may hold open on a replica.
    pub max_per_user: usize,
    /// Sessions one node may serve at once (through a replica).
    pub max_per_node: usize,
    /// How long a request waits for its node to dial back.
    pub attach_wait: Duration,
}

impl Default for SessionSettings {
    fn default() -> Self {
        SessionSettings { idle_timeout: Duration::from_secs(30 * 60), max_per_user: 16, max_per_node: 64, attach_wait: Duration::from_secs(15) }
    }
}

/// A node's dial-back once upgraded: session frames both ways.
pub trait SessionStream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> SessionStream for T {}

pub type Dialed = Box<dyn SessionStream>;

#[derive(Default)]
struct Inner {
    waiting: HashMap<String, oneshot::Sender<Dialed>>,
    per_user: HashMap<String, usize>,
    per_node: HashMap<String, usize>,
}

/// This replica's sessions: the requests waiting for a dial-back, and how
/// many each user and node hold.
#[derive(Default, Clone)]
pub struct Sessions {
    inner: Arc<Mutex<Inner>>,
}

/// A session's place in the counts, given back when dropped.
pub struct Held {
    inner: Arc<Mutex<Inner>>,
    id: String,
    user: String,
    node: String,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut guard = self.inner.lock().expect("sessions lock");
        let inner = &mut *guard;
        inner.waiting.remove(&self.id);
        for (map, key) in [(&mut inner.per_user, &self.user), (&mut inner.per_node, &self.node)] {
            if let Some(count) = map.get_mut(key) {
                *count -= 1;
                if *count == 0 {
                    map.remove(key);
                }
            }
        }
    }
}

impl Sessions {
    /// Counts a new session of `user` on `node`, unless either is at its
    /// limit; with the receiver its dial-back arrives on.
    fn admit(&self, settings: &SessionSettings, id: &str, user: &str, node: &str) -> Result<(Held, oneshot::Receiver<Dialed>), ApiError> {
        let mut inner = self.inner.lock().expect("sessions lock");
        if inner.per_user.get(user).copied().unwrap_or(0) >= settings.max_per_user {
            return Err(ApiError::TooManyRequests {
                message: format!("{user} holds {} sessions open already (the most at once); close one first", settings.max_per_user),
                retry_after_s: 5,
            });
        }
        if inner.per_node.get(node).copied().unwrap_or(0) >= settings.max_per_node {
            return Err(ApiError::TooManyRequests {
                message: format!("node {node} serves {} sessions already (the most at once); try again later", settings.max_per_node),
                retry_after_s: 5,
            });
        }
        *inner.per_user.entry(user.to_string()).or_default() += 1;
        *inner.per_node.entry(node.to_string()).or_default() += 1;
        let (sender, receiver) = oneshot::channel();
        inner.waiting.insert(id.to_string(), sender);
        Ok((Held { inner: self.inner.clone(), id: id.to_string(), user: user.to_string(), node: node.to_string() }, receiver))
    }

    /// Hands a node's dial-back to the request waiting for it; gives the
    /// stream back when none waits (the user left).
    pub fn deliver(&self, id: &str, stream: Dialed) -> Result<(), Dialed> {
        let sender = self.inner.lock().expect("sessions lock").waiting.remove(id);
        match sender {
            Some(sender) => sender.send(stream),
            None => Err(stream),
        }
    }

    /// Whether a request on this replica waits for this session.
    pub fn is_waiting(&self, id: &str) -> bool {
        self.inner.lock().expect("sessions lock").waiting.contains_key(id)
    }

    /// Sessions open (or opening) on this replica.
    pub fn open_count(&self) -> usize {
        self.inner.lock().expect("sessions lock").per_user.values().sum()
    }
}

/// What a session is opened into.
#[derive(Debug, Clone)]
pub enum Subject {
    /// A running instance of an app: the one numbered `instance`, else the
    /// lowest running one.
    App { name: String, instance: Option<u32> },
    /// A managed service's container.
    Service { name: String },
}

/// What a user asks for.
#[derive(Debug, Clone)]
pub struct OpenRequest {
    pub subject: Subject,
    pub target: SessionTarget,
    /// Who asks (a user's name, `admin` for the admin token).
    pub user: String,
}

/// An attached session: its record, the node's stream, its place in the
/// counts (held as long as the session runs).
pub struct Opened {
    pub row: ExecSessionRow,
    pub stream: Dialed,
    pub held: Held,
}

/// Where a session goes: the record's subject and name, the node, the
/// container, and for an app its deployment and instance.
struct Placed {
    subject: &'static str,
    name: String,
    node_id: String,
    container: String,
    deployment_id: String,
    instance: i64,
    /// How the user names what runs there, for messages.
    what: String,
}

async fn place(state: &AppState, subject: &Subject) -> Result<Placed, ApiError> {
    match subject {
        Subject::Service { name } => {
            let Some(service) = state.store.service(name).await? else {
                return Err(ApiError::NotFound(format!("no service {name:?}")));
            };
            Ok(Placed {
                subject: "service",
                name: service.name.clone(),
                node_id: service.node_id.clone(),
                container: cloudweb_protocol::services::container_name(&service.name),
                deployment_id: String::new(),
                instance: 0,
                what: format!("service {}", service.name),
            })
        }
        Subject::App { name, instance } => {
            let Some(app) = state.store.app(name).await? else {
                return Err(ApiError::NotFound(format!("no app {name:?}")));
            };
            let deployments = state.store.app_deployments(&app.name).await?;
            let Some(running) = deployments.iter().filter(|d| d.state == "running").max_by_key(|d| d.seq) else {
                return Err(ApiError::Conflict(format!("app {} has no running deployment", app.name)));
            };
            let instances: Vec<_> = state
                .store
                .instances(&running.id)
                .await?
                .into_iter()
                .filter(|i| i.state == "running" && i.node_id.is_some() && i.container.is_some())
                .collect();
            let chosen = match instance {
                Some(number) => instances.iter().find(|i| i.instance == i64::from(*number)).ok_or_else(|| {
                    let running: Vec<String> = instances.iter().map(|i| i.instance.to_string()).collect();
                    ApiError::NotFound(format!(
                        "app {} has no running instance {number} (running: {})",
                        app.name,
                        if running.is_empty() { "none".to_string() } else { running.join(", ") }
                    ))
                })?,
                None => instances
                    .iter()
                    .min_by_key(|i| i.instance)
                    .ok_or_else(|| ApiError::Conflict(format!("app {} has no running instance", app.name)))?,
            };
            Ok(Placed {
                subject: "app",
                name: app.name.clone(),
                node_id: chosen.node_id.clone().expect("filtered"),
                container: chosen.container.clone().expect("filtered"),
                deployment_id: running.id.clone(),
                instance: chosen.instance,
                what: format!("instance {} of {}", chosen.instance, app.name),
            })
        }
    }
}

/// Opens a session: finds where it goes (an app's running instance, a
/// service's container), records the session with its node's command, and
/// waits (at most the settings' `attach_wait`) for the node to dial back.
pub async fn open(state: &AppState, request: OpenRequest) -> Result<Opened, ApiError> {
    let placed = place(state, &request.subject).await?;
    let node_id = placed.node_id.clone();
    let now = tokio::time::Instant::now();
    match state.nodes.get(&node_id) {
        Some(node) if node.state(now, state.config.unreachable_after) == crate::live::NodeState::Ready => {
            if !node.has_feature(now, cloudweb_protocol::features::SESSIONS) {
                return Err(ApiError::Conflict(format!("node {node_id} runs an agent without exec sessions: upgrade it")));
            }
        }
        _ => return Err(ApiError::Unavailable(format!("node {node_id}, which runs {}, is not reachable", placed.what))),
    }

    let id = format!("xs_{}", crate::auth::random_hex(8));
    let settings = &state.config.sessions;
    let (held, dialed) = state.sessions.admit(settings, &id, &request.user, &node_id)?;
    let payload = SessionOpenPayload {
        session_id: id.clone(),
        dial_url: state.config.public_url.to_string().trim_end_matches('/').to_string(),
        container: placed.container.clone(),
        target: request.target.clone(),
    };
    payload.validate().map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let (kind, program, port, tty) = match &request.target {
        SessionTarget::Exec { command, tty, .. } => ("exec", command.first().cloned(), None, *tty),
        SessionTarget::Forward { port } => ("port-forward", None, Some(i64::from(*port)), false),
    };
    let now_ms = state.clock.now_ms();
    let row = ExecSessionRow {
        id: id.clone(),
        subject: placed.subject.to_string(),
        name: placed.name.clone(),
        kind: kind.to_string(),
        user_name: request.user.clone(),
        node_id: node_id.clone(),
        deployment_id: placed.deployment_id.clone(),
        instance: placed.instance,
        container: placed.container.clone(),
        program,
        port,
        tty,
        replica: payload.dial_url.clone(),
        state: "opening".to_string(),
        created_at: now_ms,
        ..Default::default()
    };
    let value = serde_json::to_value(&payload).map_err(|e| ApiError::Internal(e.to_string()))?;
    let command = store::NewCommand {
        node_id: node_id.clone(),
        kind: CommandKind::SessionOpen.as_str().to_string(),
        payload: state.sealer.seal_json(&crate::command_context(&node_id), &value),
    };
    state.store.insert_exec_session(&row, &command, now_ms).await?;
    state.hub.notify(&node_id, cloudweb_protocol::events::COMMANDS);

    match tokio::time::timeout(settings.attach_wait, dialed).await {
        Ok(Ok(stream)) => {
            let mut row = row;
            row.state = "open".to_string();
            row.attached_at = Some(state.clock.now_ms());
            Ok(Opened { row, stream, held })
        }
        _ => {
            let message = format!("node {node_id} did not open the session within {} s", settings.attach_wait.as_secs());
            let end = SessionEnd { state: "failed", exit_code: None, message: Some(&message), bytes_in: 0, bytes_out: 0 };
            if let Err(err) = state.store.end_exec_session(&id, &end, state.clock.now_ms()).await {
                tracing::warn!(session = %id, error = %err, "could not record a session that was never attached");
            }
            Err(ApiError::Unavailable(message))
        }
    }
}

/// What a session ended with, as the bridge saw it.
#[derive(Debug, Clone, Default)]
pub struct Ended {
    /// The process's exit status (exec), if it ended.
    pub exit_code: Option<i32>,
    /// Why the session ended otherwise (the node went away, idle, an
    /// error from the node); `None` for a process that exited or a user
    /// who closed the session.
    pub failure: Option<String>,
    /// A note on an ordinary end (the user closed it).
    pub note: Option<String>,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// Records how a session ended.
pub async fn record_end(state: &AppState, id: &str, ended: &Ended) {
    let message = ended.failure.as_deref().or(ended.note.as_deref());
    let end = SessionEnd {
        state: if ended.failure.is_some() { "failed" } else { "ended" },
        exit_code: ended.exit_code.map(i64::from),
        message,
        bytes_in: i64::try_from(ended.bytes_in).unwrap_or(i64::MAX),
        bytes_out: i64::try_from(ended.bytes_out).unwrap_or(i64::MAX),
    };
    if let Err(err) = state.store.end_exec_session(id, &end, state.clock.now_ms()).await {
        tracing::warn!(session = %id, error = %err, "could not record the end of a session");
    }
}

/// At start: the sessions this replica held before it stopped have no user
/// side any more.
pub async fn end_left_open(state: &AppState) {
    let replica = state.config.public_url.to_string().trim_end_matches('/').to_string();
    match state.store.end_exec_sessions_of_replica(&replica, "the control plane restarted", state.clock.now_ms()).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(sessions = n, "ended the sessions left open before this start"),
        Err(err) => tracing::warn!(error = %err, "could not end the sessions left open"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_count_per_user_and_node_and_free_on_drop() {
        let sessions = Sessions::default();
        let settings = SessionSettings { max_per_user: 2, max_per_node: 3, ..Default::default() };
        let a = sessions.admit(&settings, "xs_1", "ana", "n1").unwrap();
        let _b = sessions.admit(&settings, "xs_2", "ana", "n1").unwrap();
        assert!(matches!(sessions.admit(&settings, "xs_3", "ana", "n2"), Err(ApiError::TooManyRequests { .. })), "ana is at her limit");
        let _c = sessions.admit(&settings, "xs_4", "bo", "n1").unwrap();
        assert!(matches!(sessions.admit(&settings, "xs_5", "cy", "n1"), Err(ApiError::TooManyRequests { .. })), "n1 is at its limit");
        assert_eq!(sessions.open_count(), 3);
        drop(a);
        assert!(!sessions.is_waiting("xs_1"));
        sessions.admit(&settings, "xs_6", "ana", "n2").unwrap();
    }

    #[tokio::test]
    async fn a_dial_back_reaches_the_waiting_request_or_comes_back() {
        let sessions = Sessions::default();
        let settings = SessionSettings::default();
        let (_held, receiver) = sessions.admit(&settings, "xs_1", "ana", "n1").unwrap();
        let (a, _b) = tokio::io::duplex(64);
        assert!(sessions.deliver("xs_1", Box::new(a)).is_ok());
        assert!(receiver.await.is_ok());
        let (c, _d) = tokio::io::duplex(64);
        assert!(sessions.deliver("xs_1", Box::new(c)).is_err(), "delivered once");
    }
}
