//! The control plane started in-process with a clock the test moves and
//! settings it picks, plus helpers that speak for nodes by hand: join,
//! heartbeat, report. For tests of server behaviour that needs no real
//! agent (placement, node loss, retention, the store's failure paths).

use std::path::Path;
use std::sync::Arc;

use cloudweb_server::clock::ShiftedClock;
use cloudweb_server::config::Config;
use cloudweb_server::RunningServer;
use reqwest::Method;
use serde_json::{json, Value};

use crate::{key_and_csr, RawClient};

pub struct Control {
    pub server: RunningServer,
    pub clock: ShiftedClock,
    pub admin: String,
    pub http: reqwest::Client,
}

/// A node spoken for by the test.
pub struct HandNode {
    pub id: String,
    pub client: RawClient,
}

impl Control {
    /// Starts on `dir` with `Config::local` changed by `tweak`.
    pub async fn start(dir: &Path, tweak: impl FnOnce(&mut Config)) -> Control {
        let clock = ShiftedClock::default();
        let mut config = Config::local(dir.to_path_buf());
        config.database_url = crate::state_db::url_for(dir).map(|url| cloudweb_server::store::DatabaseUrl::parse(&url).unwrap());
        tweak(&mut config);
        let server = cloudweb_server::start(config, Arc::new(clock.clone())).await.unwrap();
        let admin = std::fs::read_to_string(dir.join("admin-token")).unwrap().trim().to_string();
        Control { server, clock, admin, http: reqwest::Client::new() }
    }

    pub fn agent_url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.server.agent_addr.port())
    }

    pub fn anonymous(&self) -> RawClient {
        RawClient::new(self.server.state.ca.cert_pem(), None)
    }

    /// A user API call with the admin token: status and JSON (Null when
    /// the body is not JSON).
    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_with(method, path, &[], body).await
    }

    pub async fn call_with(&self, method: Method, path: &str, headers: &[(&str, &str)], body: Option<Value>) -> (u16, Value) {
        let mut request = self.http.request(method, format!("http://{}{path}", self.server.api_addr)).bearer_auth(&self.admin);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub async fn token(&self) -> String {
        let (status, body) = self.call(Method::POST, "/api/join-tokens", None).await;
        assert_eq!(status, 201, "{body}");
        body["token"].as_str().unwrap().to_string()
    }

    /// Joins a node by hand (no heartbeat yet).
    pub async fn join(&self, name: &str) -> HandNode {
        let (key, csr) = key_and_csr(|_| {});
        let body = json!({"token": self.token().await, "csr": csr, "hostname": "h", "name": name}).to_string();
        let (status, text) = self.anonymous().send(Method::POST, &self.agent_url("/agent/v1/join"), &[], Some(&body)).await.unwrap();
        assert_eq!(status, 200, "{text}");
        let joined: Value = serde_json::from_str(&text).unwrap();
        HandNode {
            id: joined["node_id"].as_str().unwrap().to_string(),
            client: RawClient::new(self.server.state.ca.cert_pem(), Some((joined["certificate"].as_str().unwrap(), &key))),
        }
    }

    /// Sends `body` as the node's heartbeat; asserts a 200.
    pub async fn heartbeat(&self, node: &HandNode, body: Value) {
        let (status, text) = node.client.send(Method::POST, &self.agent_url("/agent/v1/heartbeat"), &[], Some(&body.to_string())).await.unwrap();
        assert_eq!(status, 200, "{text}");
    }

    /// A heartbeat with room for a few instances.
    pub async fn alive(&self, node: &HandNode) {
        self.heartbeat(node, json!({"cpu_cores": 4, "mem_bytes": 8u64 << 30, "disk_bytes": 100u64 << 30})).await;
    }

    /// Sends a report for the node; returns the status.
    pub async fn report(&self, node: &HandNode, body: Value) -> u16 {
        node.client.send(Method::POST, &self.agent_url("/agent/v1/report"), &[], Some(&body.to_string())).await.unwrap().0
    }

    pub async fn create_app(&self, name: &str, extra: Value) -> (u16, Value) {
        let mut body = json!({"name": name, "repo_url": "https://git.example.com/app.git", "port": 8080});
        for (key, value) in extra.as_object().into_iter().flatten() {
            body[key] = value.clone();
        }
        self.call(Method::POST, "/api/apps", Some(body)).await
    }

    pub async fn deployment(&self, id: &str) -> Value {
        let (status, body) = self.call(Method::GET, &format!("/api/deployments/{id}"), None).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// Polls the deployment every 50 ms until `check` holds (or panics
    /// after `seconds`).
    pub async fn deployment_until(&self, id: &str, seconds: u64, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        let start = std::time::Instant::now();
        loop {
            let d = self.deployment(id).await;
            if check(&d) {
                return d;
            }
            assert!(start.elapsed().as_secs() < seconds, "timed out waiting for {what}: {d}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Reports the deployment's instance `instance` built and running on
    /// `node`.
    pub async fn run_on(&self, node: &HandNode, deployment: &str, instance: u32) {
        let image = format!("10.77.0.1:5000/app:{deployment}");
        for body in [
            json!({"deployment_id": deployment, "instance": instance, "state": "building"}),
            json!({"deployment_id": deployment, "instance": instance, "state": "deploying", "image": image}),
            json!({"deployment_id": deployment, "instance": instance, "state": "running", "address": "10.77.0.2:32768"}),
        ] {
            assert_eq!(self.report(node, body.clone()).await, 202, "{body}");
        }
    }
}

/// Ready after `d` of wall time, polled as often as the runtime can: a
/// cancellation point finer than the timer's millisecond.
pub async fn spin(d: std::time::Duration) {
    let start = std::time::Instant::now();
    std::future::poll_fn(|cx| {
        if start.elapsed() >= d {
            std::task::Poll::Ready(())
        } else {
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await
}

/// Ready once `condition` holds, checked at every poll of the task (after
/// the futures a biased `select!` lists before it).
pub async fn reached(condition: impl Fn() -> bool) {
    std::future::poll_fn(|cx| {
        if condition() {
            std::task::Poll::Ready(())
        } else {
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await
}

/// Wraps `future` and polls it only when it asked to be woken (and
/// first): a wrapper sharing the task (a `select!`) would otherwise poll it
/// at every wake-up of the others. Counts its polls that ended `Pending`.
/// For a store write the first always does (its BEGIN runs in a task of
/// its own, and that task's end is the only wake-up the write asks for);
/// so a write whose second poll also ended `Pending` held its transaction
/// object and was waiting on a statement or on the commit.
pub struct Steps<F> {
    inner: std::pin::Pin<Box<F>>,
    counting: Arc<Counting>,
    seen: Option<usize>,
    pub pending: Arc<std::sync::atomic::AtomicUsize>,
}

impl<F: std::future::Future> Steps<F> {
    pub fn new(future: F) -> Steps<F> {
        let counting = Arc::new(Counting { wakes: Default::default(), outer: std::sync::Mutex::new(None) });
        Steps { inner: Box::pin(future), counting, seen: None, pending: Arc::default() }
    }
}

struct Counting {
    wakes: std::sync::atomic::AtomicUsize,
    outer: std::sync::Mutex<Option<std::task::Waker>>,
}

impl std::task::Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Some(outer) = self.outer.lock().unwrap().as_ref() {
            outer.wake_by_ref();
        }
    }
}

impl<F: std::future::Future> std::future::Future for Steps<F> {
    type Output = F::Output;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<F::Output> {
        *self.counting.outer.lock().unwrap() = Some(cx.waker().clone());
        let wakes = self.counting.wakes.load(std::sync::atomic::Ordering::SeqCst);
        if self.seen == Some(wakes) {
            // Not woken by its own waker since the last poll.
            return std::task::Poll::Pending;
        }
        self.seen = Some(wakes);
        let waker = std::task::Waker::from(self.counting.clone());
        let poll = self.inner.as_mut().poll(&mut std::task::Context::from_waker(&waker));
        if poll.is_pending() {
            self.pending.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        poll
    }
}
