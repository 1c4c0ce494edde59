//! Issue 25, tasks, end to end with the real binaries and Docker: one-off
//! runs of a command in the app's running image (output, exit status,
//! time limit, cancel, a program that does not exist, `cloudweb run`'s exit
//! status), and a scheduled job that runs once per tick across a
//! control-plane restart, the tick missed while it was down included.

use std::process::Command;
use std::time::Duration;

use cloudweb_e2e::docker;
use cloudweb_e2e::{bin, start_platform, unique_name, wait_for, AgentNode, Platform, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

const AGENT_FLAGS: [&str; 6] = ["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"];

const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nRUN mkdir -p /www && echo ok > /www/index.html\nCMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n";

async fn call(server: &ServerProcess, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    server.call(method, path, body).await.unwrap()
}

/// A platform with one node that runs tasks, and an app deployed on it
/// with `FOO=bar` in its environment.
async fn app_running() -> (Platform, AgentNode, String) {
    let platform = start_platform(&[]).await.unwrap();
    let server = &platform.server;
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(server, &platform.tmp.path().join("node"), "worker", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();
    let node_id = agent.node_id.clone();
    wait_for(Duration::from_secs(20), "the node to report tasks", || async {
        let node = server.node(&node_id).await.ok()?;
        (node["state"] == "ready" && node["features"].as_array()?.iter().any(|f| f == "tasks")).then_some(())
    })
    .await
    .unwrap();
    platform.git.commit("tasks", &[("Dockerfile", DOCKERFILE)], "an app").unwrap();
    let app = unique_name("tasks");
    let (status, body) = call(server, Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": platform.git.url("tasks"), "port": 8080}))).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = call(server, Method::PUT, &format!("/api/apps/{app}/env"), Some(json!({"FOO": "bar"}))).await;
    assert_eq!(status, 200, "{body}");
    server.deploy_and_settle(&app, None).await.unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));
    (platform, agent, app)
}

/// Starts a one-off run and waits for its end; returns the run and its
/// lines.
async fn run_to_end(server: &ServerProcess, agent: &AgentNode, app: &str, body: Value) -> (Value, Vec<Value>) {
    let (status, run) = call(server, Method::POST, &format!("/api/apps/{app}/runs"), Some(body)).await;
    assert_eq!(status, 202, "{run}");
    let id = run["id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(60), "the run to end", || async {
        let (_, logs) = server.call(Method::GET, &format!("/api/apps/{app}/runs/{id}/logs"), None).await.ok()?;
        (!matches!(logs["run"]["state"].as_str(), Some("queued" | "running"))).then(|| (logs["run"].clone(), logs["lines"].as_array().cloned().unwrap_or_default()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()))
}

fn task_containers(run_id: &str) -> Vec<String> {
    docker::ps(&["-a", "-q", "--filter", &format!("name=cloudweb-task-{run_id}")])
}

#[tokio::test]
async fn a_one_off_run_gives_its_output_and_exit_status_and_is_bounded() {
    let (platform, agent, app) = app_running().await;
    let server = &platform.server;

    // Output in order, stderr marked, the app's environment, the exit code.
    let command = json!(["sh", "-c", "echo hello $FOO; echo oops >&2; sleep 1; echo done; exit 3"]);
    let (run, lines) = run_to_end(server, &agent, &app, json!({"command": command})).await;
    assert_eq!(run["state"], "failed", "{run}");
    assert_eq!(run["exit_code"], 3, "{run}");
    assert_eq!(run["trigger"], "one-off");
    let text: Vec<(&str, bool)> = lines.iter().map(|l| (l["line"].as_str().unwrap(), l["stderr"].as_bool().unwrap_or(false))).collect();
    assert!(text.contains(&("hello bar", false)), "{lines:?}");
    assert!(text.contains(&("oops", true)), "{lines:?}");
    assert_eq!(text.last(), Some(&("done", false)), "{lines:?}");
    let seqs: Vec<u64> = lines.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]) && seqs[0] == 1, "numbered from 1: {seqs:?}");
    assert!(run["deployment_id"].is_string() && run["image"].is_string(), "{run}");
    let id = run["id"].as_str().unwrap();
    wait_for(Duration::from_secs(30), "the run's container to be removed", || async { task_containers(id).is_empty().then_some(()) }).await.unwrap();

    // A time limit kills it.
    let (run, _) = run_to_end(server, &agent, &app, json!({"command": ["sleep", "60"], "timeout_seconds": 2})).await;
    assert_eq!(run["state"], "timed_out", "{run}");
    let duration = run["duration_ms"].as_u64().unwrap_or(u64::MAX);
    assert!(duration < 30_000, "killed at its limit, not after the sleep: {run}");

    // A program the image does not have: failed, with a reason.
    let (run, _) = run_to_end(server, &agent, &app, json!({"command": ["/no/such/program"]})).await;
    assert_eq!(run["state"], "failed", "{run}");
    assert!(run["message"].as_str().is_some_and(|m| !m.is_empty()), "{run}");

    // Cancelled while it runs: its container goes.
    let (status, run) = call(server, Method::POST, &format!("/api/apps/{app}/runs"), Some(json!({"command": ["sleep", "120"]}))).await;
    assert_eq!(status, 202, "{run}");
    let id = run["id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(60), "the run to start", || async {
        let (_, r) = server.call(Method::GET, &format!("/api/apps/{app}/runs/{id}"), None).await.ok()?;
        (r["state"] == "running").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));
    let (status, run) = call(server, Method::POST, &format!("/api/apps/{app}/runs/{id}/cancel"), None).await;
    assert_eq!((status, run["state"].as_str()), (200, Some("cancelled")), "{run}");
    wait_for(Duration::from_secs(30), "the cancelled run's container to go", || async { task_containers(&id).is_empty().then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));

    // Bad input is refused with a reason, and records nothing.
    let (status, body) = call(server, Method::POST, &format!("/api/apps/{app}/runs"), Some(json!({"command": []}))).await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = call(server, Method::POST, &format!("/api/apps/{app}/runs"), Some(json!({"command": ["true"], "timeout_seconds": 0}))).await;
    assert_eq!(status, 400, "{body}");
    let (_, listed) = call(server, Method::GET, &format!("/api/apps/{app}/runs"), None).await;
    assert_eq!(listed["runs"].as_array().unwrap().len(), 4, "{listed}");

    // `cloudweb run` prints the output and exits with the run's status.
    let output = Command::new(bin("cloudweb"))
        .args(["run", &app, "--", "sh", "-c", "echo from-cli; exit 7"])
        .env("CLOUDWEB_SERVER", server.api(""))
        .env("CLOUDWEB_TOKEN", &server.admin_token)
        .env("HOME", platform.tmp.path())
        .env("XDG_CONFIG_HOME", platform.tmp.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(7), "stdout: {stdout}\nstderr: {}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("from-cli"), "{stdout}");
}

/// The start of the next minute after `ms`, in ms.
fn next_minute(ms: i64) -> i64 {
    (ms / 60_000 + 1) * 60_000
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

#[tokio::test]
async fn a_scheduled_job_runs_once_per_tick_across_a_control_plane_restart() {
    let (mut platform, agent, app) = app_running().await;
    // Bad schedules and zones are refused with a reason.
    for (schedule, zone) in [("61 * * * *", "UTC"), ("* * * * *", "Mars/Olympus"), ("0 0 31 2 *", "UTC")] {
        let (status, body) =
            call(&platform.server, Method::POST, &format!("/api/apps/{app}/cron"), Some(json!({"name": "bad", "schedule": schedule, "timezone": zone, "command": ["true"]}))).await;
        assert_eq!(status, 400, "{schedule} {zone}: {body}");
    }
    let (status, job) = call(
        &platform.server,
        Method::POST,
        &format!("/api/apps/{app}/cron"),
        Some(json!({"name": "every-minute", "schedule": "* * * * *", "timezone": "Europe/Madrid", "command": ["sh", "-c", "echo tick $FOO"]})),
    )
    .await;
    assert_eq!(status, 201, "{job}");
    let first_tick = next_minute(now_ms());
    let runs_path = format!("/api/apps/{app}/runs?job=every-minute");
    // The first tick's run.
    wait_for(Duration::from_secs(100), "the first tick's run to end", || async {
        let (_, listed) = platform.server.call(Method::GET, &runs_path, None).await.ok()?;
        listed["runs"].as_array()?.iter().any(|r| r["state"] == "succeeded").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));
    // Down across the next tick: it runs once when the control plane is
    // back (well within the default starting deadline of an hour).
    let down_until = next_minute(now_ms()) + 3_000;
    platform.server.restart_after(Duration::from_millis((down_until - now_ms()).max(0) as u64)).await.unwrap();
    let back = now_ms();
    // And the tick after that runs in its time.
    let last_tick = next_minute(back);
    let server = &platform.server;
    let runs = wait_for(Duration::from_secs(100), "the tick after the restart to run", || async {
        let (_, listed) = server.call(Method::GET, &runs_path, None).await.ok()?;
        let runs = listed["runs"].as_array()?.clone();
        runs.iter().any(|r| r["scheduled_for"].as_str().is_some_and(|at| ms_of(at) >= last_tick) && r["state"] == "succeeded").then_some(runs)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}\nserver log:\n{}", agent.log_text(), server.process.log_text()));
    // Exactly one run per tick from the first on, none skipped, all
    // succeeded, oldest first.
    let mut ticks: Vec<i64> = runs.iter().map(|r| ms_of(r["scheduled_for"].as_str().unwrap())).collect();
    ticks.sort();
    let expected: Vec<i64> = (0..ticks.len() as i64).map(|i| ticks[0] + i * 60_000).collect();
    assert_eq!(ticks, expected, "one run per minute, no tick twice or missing: {runs:#?}");
    assert!(ticks[0] <= first_tick + 60_000, "the first tick ran: {runs:#?}");
    assert!(ticks.len() >= 3, "the tick missed while down ran once: {runs:#?}");
    for run in &runs {
        assert_eq!(run["state"], "succeeded", "{run}");
        assert_eq!(run["trigger"], "schedule", "{run}");
    }
    let id = runs.iter().find(|r| ms_of(r["scheduled_for"].as_str().unwrap()) >= last_tick).unwrap()["id"].as_str().unwrap().to_string();
    let (_, logs) = call(server, Method::GET, &format!("/api/apps/{app}/runs/{id}/logs"), None).await;
    assert_eq!(logs["lines"][0]["line"], "tick bar", "{logs}");
    // Suspended: no more ticks; the job shows its last run.
    let (status, job) = call(server, Method::PATCH, &format!("/api/apps/{app}/cron/every-minute"), Some(json!({"suspended": true}))).await;
    assert_eq!(status, 200, "{job}");
    assert!(job["next_run_at"].is_null() && job["last_run"]["state"] == "succeeded", "{job}");
    let (status, _) = call(server, Method::DELETE, &format!("/api/apps/{app}/cron/every-minute"), None).await;
    assert_eq!(status, 204);
    let (_, listed) = call(server, Method::GET, &runs_path, None).await;
    assert_eq!(listed["runs"].as_array().unwrap().len(), runs.len(), "the history stays after the job goes");

    // A job whose run fails is an alert until the job is fixed or gone.
    let (status, _) = call(server, Method::POST, &format!("/api/apps/{app}/cron"), Some(json!({"name": "broken", "schedule": "0 3 1 1 *", "command": ["sh", "-c", "exit 4"]}))).await;
    assert_eq!(status, 201);
    let (status, run) = call(server, Method::POST, &format!("/api/apps/{app}/cron/broken/run"), None).await;
    assert!(status == 202 || status == 201, "{run}");
    let subject = format!("{app}/broken");
    let alert = wait_for(Duration::from_secs(60), "the job_failed alert", || async {
        let (_, list) = server.call(Method::GET, "/api/alerts", None).await.ok()?;
        list["alerts"].as_array()?.iter().find(|a| a["kind"] == "job_failed" && a["subject"] == subject.as_str()).cloned()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));
    assert!(alert["summary"].as_str().unwrap().contains("failed"), "{alert}");
    let (status, _) = call(server, Method::DELETE, &format!("/api/apps/{app}/cron/broken"), None).await;
    assert_eq!(status, 204);
    wait_for(Duration::from_secs(20), "the alert resolved with its job gone", || async {
        let (_, list) = server.call(Method::GET, "/api/alerts", None).await.ok()?;
        (!list["alerts"].as_array()?.iter().any(|a| a["subject"] == subject.as_str())).then_some(())
    })
    .await
    .unwrap();
}

fn ms_of(text: &str) -> i64 {
    let at = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).unwrap();
    (at.unix_timestamp_nanos() / 1_000_000) as i64
}
