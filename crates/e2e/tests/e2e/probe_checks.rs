//! Issue 25, probe checks and crash loops, end to end with the real
//! binaries and Docker: an app that exits with code 3 four seconds after
//! each start is restarted by Docker and reported crash-looping (its
//! restarts, exit code, reason and last output lines) in `top` and in the
//! app list; its readiness probe asks a TCP port nothing listens on, so it
//! is unready with that reason; its liveness probe runs a command the
//! image does not have: reported once as a probe that cannot run, and it
//! restarts nothing.

use std::time::Duration;

use cloudweb_e2e::{start_platform, unique_name, wait_for, AgentNode, Platform, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nRUN mkdir -p /www && echo up > /www/index.html\nCOPY run.sh /run.sh\nCMD [\"sh\", \"/run.sh\"]\n";
/// Serves for 4 s after each start, says so, then exits 3.
const CRASHES: &str =
    "httpd -f -p 8080 -h /www &\necho \"boom after $(date +%s)\"\nsleep 4\nexit 3\n";

async fn call(
    server: &ServerProcess,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    server.call(method, path, body).await.unwrap()
}

#[tokio::test]
async fn a_crash_loop_a_tcp_readiness_probe_and_a_missing_probe_command_are_reported() {
    let Platform { tmp, git, server } = start_platform(&[]).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "node", &token, &ca, &[])
        .unwrap()
        .unwrap();
    agent
        .start(&[
            "--heartbeat-interval-seconds",
            "1",
            "--publish-ip",
            "127.0.0.1",
            "--advertise-host",
            "127.0.0.1",
        ])
        .unwrap();
    wait_for(
        Duration::from_secs(30),
        "the node to report probe checks",
        || async {
            let (_, node) = server.call(Method::GET, "/api/nodes", None).await.ok()?;
            let node = node["nodes"].as_array()?.first()?.clone();
            (node["state"] == "ready"
                && node["features"]
                    .as_array()?
                    .iter()
                    .any(|f| f == "probe-checks"))
            .then_some(())
        },
    )
    .await
    .unwrap();
    let name = unique_name("loops");
    git.commit(
        &name,
        &[("Dockerfile", DOCKERFILE), ("run.sh", CRASHES)],
        "exits 3 after 4 s",
    )
    .unwrap();
    let liveness = json!({"interval_seconds": 2, "timeout_seconds": 2, "failure_threshold": 1, "check": {"kind": "exec", "command": ["no-such-probe", "--quick"]}});
    let readiness = json!({"interval_seconds": 1, "timeout_seconds": 1, "failure_threshold": 1, "success_threshold": 1, "check": {"kind": "tcp", "port": 9}, "grace_seconds": 1});
    for bad in [
        json!({"interval_seconds": 1, "timeout_seconds": 1, "failure_threshold": 1, "check": {"kind": "exec", "command": []}}),
        json!({"interval_seconds": 1, "timeout_seconds": 1, "failure_threshold": 1, "check": {"kind": "tcp", "port": 0}}),
        json!({"interval_seconds": 1, "timeout_seconds": 1, "failure_threshold": 1, "check": {"kind": "http", "path": "up"}}),
        json!({"interval_seconds": 1, "timeout_seconds": 1, "failure_threshold": 1, "grace_seconds": 4000}),
    ] {
        let (status, body) = call(
            &server,
            Method::POST,
            "/api/apps",
            Some(json!({"name": name, "repo_url": git.url(&name), "port": 8080, "liveness": bad})),
        )
        .await;
        assert_eq!(status, 400, "{body}");
    }
    let (status, app) = call(&server, Method::POST, "/api/apps", Some(json!({"name": name, "repo_url": git.url(&name), "port": 8080, "liveness": liveness, "readiness": readiness}))).await;
    assert_eq!(status, 201, "{app}");
    assert_eq!(
        (&app["liveness"], &app["readiness"]),
        (&liveness, &readiness),
        "{app}"
    );
    server
        .deploy_and_settle(&name, None)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_text()));

    // Docker restarts it after each exit; the third stop within ten
    // minutes makes it crash-looping, with its exit and last lines.
    let top = wait_for(Duration::from_secs(90), "the crash loop in top", || async {
        let (_, top) = server
            .call(Method::GET, &format!("/api/apps/{name}/top"), None)
            .await
            .ok()?;
        top["instances"]
            .as_array()?
            .iter()
            .find(|i| i["crash_loop"].is_object())
            .cloned()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_text()));
    let crash = &top["crash_loop"];
    assert!(crash["restarts"].as_u64().unwrap() >= 3, "{top}");
    assert_eq!(crash["exit_code"], 3, "{top}");
    assert_eq!(
        crash["reason"], "exited with code 3",
        "Docker's restarts, not the probe's: {top}"
    );
    assert!(
        crash["last_lines"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap_or("").starts_with("boom after")),
        "{top}"
    );
    let (_, list) = call(&server, Method::GET, "/api/apps", None).await;
    let listed = list["apps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == name.as_str())
        .cloned()
        .unwrap();
    assert_eq!(listed["crash_looping"], 1, "{listed}");

    // The readiness probe's TCP check fails on the closed port; the
    // liveness probe's command is missing: reported, not restarting.
    let top = wait_for(
        Duration::from_secs(30),
        "the unready instance and the probe problem in top",
        || async {
            let (_, top) = server
                .call(Method::GET, &format!("/api/apps/{name}/top"), None)
                .await
                .ok()?;
            let instance = top["instances"].as_array()?.first()?.clone();
            (instance["ready"] == false && instance["probe_problem"].is_string())
                .then_some(instance)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_text()));
    assert!(
        top["unready_reason"]
            .as_str()
            .unwrap()
            .contains("TCP port 9"),
        "{top}"
    );
    assert!(
        top["probe_problem"]
            .as_str()
            .unwrap()
            .contains("no-such-probe"),
        "{top}"
    );
    eprintln!("probe checks: top says {top}");
    let log = agent.log_text();
    assert_eq!(
        log.matches("the liveness probe cannot run as set").count(),
        1,
        "said once\n{log}"
    );
    assert!(
        !log.contains("liveness probe failed; restarting the container"),
        "a broken probe restarts nothing\n{log}"
    );

    let (status, _) = call(&server, Method::DELETE, &format!("/api/apps/{name}"), None).await;
    assert_eq!(status, 204);
}
