//! The OpenAPI document at `/api/openapi.json` as tools outside this
//! project read it: `openapi-spec-validator` accepts it, every body it
//! describes has a real schema (not `{}`), operation ids are unique, and a
//! Python client that `openapi-python-client` generates from it creates an
//! app, deploys it and reads the deployment on a real control plane with a
//! real agent. (That the document lists exactly the router's routes, and
//! that every listed route is guarded as it says, is checked in
//! `accounts.rs`.)
//!
//! Both tools come from PyPI (`scripts/deps.sh` installs them).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cloudweb_e2e::control::Control;
use cloudweb_e2e::{start_platform, unique_name, wait_for, AgentNode, Platform};
use serde_json::Value;

const AGENT_FLAGS: [&str; 6] = ["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"];

const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nRUN mkdir -p /www && echo ok > /www/index.html\n\
CMD [\"sh\", \"-c\", \"exec httpd -f -p 8080 -h /www\"]\n";

/// Where pip puts the scripts of what it installs.
fn python_scripts() -> PathBuf {
    let output = Command::new("python3").args(["-c", "import sysconfig; print(sysconfig.get_path('scripts'))"]).output().unwrap();
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// Runs a command; panics with its output unless it succeeds.
#[track_caller]
fn run(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("{command:?}: {e} (scripts/deps.sh installs the Python tools)"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{command:?} failed ({})\nstdout: {stdout}\nstderr: {stderr}", output.status);
    stdout
}

async fn served_document(http: &reqwest::Client, base: &str) -> (String, Value) {
    let response = http.get(format!("{base}/api/openapi.json")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    let doc = serde_json::from_str(&text).unwrap();
    (text, doc)
}

/// Every schema of a request or response body, as `(where, schema)`.
fn body_schemas(doc: &Value) -> Vec<(String, Value)> {
    let mut schemas = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let at = format!("{} {path}", method.to_ascii_uppercase());
            for (media, content) in op["requestBody"]["content"].as_object().into_iter().flatten() {
                schemas.push((format!("{at} request {media}"), content["schema"].clone()));
            }
            for (status, answer) in op["responses"].as_object().unwrap() {
                for (media, content) in answer["content"].as_object().into_iter().flatten() {
                    schemas.push((format!("{at} {status} {media}"), content["schema"].clone()));
                }
            }
        }
    }
    schemas
}

/// A schema that says nothing about its value: `{}` or `true`.
fn says_nothing(schema: &Value) -> bool {
    schema == &Value::Bool(true) || schema.as_object().is_some_and(|o| o.is_empty())
}

#[tokio::test]
async fn the_served_document_validates_and_every_body_has_a_schema() {
    let dir = tempfile::tempdir().unwrap();
    let cp = Control::start(dir.path(), |_| {}).await;
    let (text, doc) = served_document(&cp.http, &format!("http://{}", cp.server.api_addr)).await;
    assert_eq!(doc["openapi"], "3.1.0");

    // What openapi-spec-validator (the reference validator) says.
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, &text).unwrap();
    run(Command::new("python3").args(["-c", "import sys; from openapi_spec_validator import validate; from openapi_spec_validator.readers import read_from_filename; validate(read_from_filename(sys.argv[1])[0]); print('valid')"]).arg(&file));

    // Operation ids: present, unique, `<resource>_<verb>`.
    let mut ids = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap_or_else(|| panic!("{method} {path} has no operationId"));
            assert!(id.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') && !id.starts_with('_'), "{method} {path}: {id}");
            ids.push(id.to_string());
        }
    }
    let count = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), count, "repeated operation ids");

    // Every body has a schema that describes it; every JSON answer names a
    // component (an object type, or the Error shape).
    let schemas = body_schemas(&doc);
    assert!(schemas.len() > 80, "{}", schemas.len());
    for (at, schema) in &schemas {
        assert!(!schema.is_null() && !says_nothing(schema), "{at}: no schema");
        let json_answer = at.ends_with("application/json") && !at.contains(" request ");
        if json_answer && !at.starts_with("GET /api/tokens 200") && !at.starts_with("GET /api/users 200") {
            assert!(schema["$ref"].as_str().is_some_and(|r| r.starts_with("#/components/schemas/")), "{at}: {schema}");
        }
    }
    // ...and the components those names point to exist and have
    // properties (a `$ref` to nothing would not validate anyway).
    let components = doc["components"]["schemas"].as_object().unwrap();
    for name in ["AppView", "CreateApp", "AppPatch", "DeploymentView", "NodeView", "Error", "SessionView", "RouteTableView"] {
        assert!(components[name]["properties"].is_object(), "{name}: {}", components.get(name).unwrap_or(&Value::Null));
    }
    assert!(components["CreateApp"]["required"].as_array().unwrap().contains(&"port".into()), "{}", components["CreateApp"]);

    // The security schemes are the gate's credentials.
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(schemes["bearer"]["scheme"], "bearer");
    assert_eq!((&schemes["session"]["in"], &schemes["session"]["name"]), (&"cookie".into(), &"cloudweb_session".into()));
    assert_eq!((&schemes["csrf"]["in"], &schemes["csrf"]["name"]), (&"header".into(), &"x-csrf-token".into()));
}

/// Generates the Python client into `dir`; returns the directory to put on
/// `PYTHONPATH`.
fn generate_client(dir: &Path, document: &Path) -> PathBuf {
    let config = dir.join("client-config.yaml");
    std::fs::write(&config, "package_name_override: cloudweb_client\nproject_name_override: cloudweb-client\n").unwrap();
    let out = dir.join("client");
    let mut generate = Command::new(python_scripts().join("openapi-python-client"));
    generate
        .args(["generate", "--meta", "none", "--overwrite", "--path"])
        .arg(document)
        .arg("--output-path")
        .arg(out.join("cloudweb_client"))
        .arg("--config")
        .arg(&config);
    let output = generate.output().unwrap_or_else(|e| panic!("openapi-python-client: {e} (scripts/deps.sh installs it)"));
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "openapi-python-client failed: {said}");
    // It skips what it cannot read (and says so) rather than failing. The
    // one thing it cannot read is /metrics' OpenMetrics text, a media type
    // it does not know (Prometheus reads that route, not this client).
    let skipped: Vec<&str> = said.lines().filter(|l| l.starts_with("WARNING")).collect();
    assert_eq!(skipped, ["WARNING parsing GET /metrics within metrics."], "openapi-python-client could not use all of the document: {said}");
    assert!(!said.contains("Error"), "{said}");
    out
}

/// What the generated client does: create, deploy, wait for running, read
/// the deployment back, with the typed models and one call per operation
/// id. Prints the deployment as JSON.
const CLIENT_SCRIPT: &str = r#"
import json, sys, time
from cloudweb_client import AuthenticatedClient
from cloudweb_client.api.apps import apps_create, apps_deploy, apps_show
from cloudweb_client.api.deployments import deployments_show
from cloudweb_client.models import AppView, CreateApp, DeployRequest, DeploymentQueued, DeploymentView

base, token, name, repo, commit = sys.argv[1:6]
client = AuthenticatedClient(base_url=base, token=token, raise_on_unexpected_status=True)

created = apps_create.sync_detailed(client=client, body=CreateApp(name=name, repo_url=repo, port=8080, health_timeout_seconds=60))
assert created.status_code == 201, (created.status_code, created.content)
assert isinstance(created.parsed, AppView), created.parsed
assert created.parsed.name == name and created.parsed.repo_url == repo, created.parsed

shown = apps_show.sync(name, client=client)
assert isinstance(shown, AppView) and shown.port == 8080 and shown.branch == "main", shown

queued = apps_deploy.sync_detailed(name, client=client, body=DeployRequest(commit=commit))
assert queued.status_code == 201, (queued.status_code, queued.content)
assert isinstance(queued.parsed, DeploymentQueued), queued.parsed
deployment_id = queued.parsed.id

deadline = time.time() + 240
while True:
    deployment = deployments_show.sync(deployment_id, client=client)
    assert isinstance(deployment, DeploymentView), deployment
    if deployment.state in ("running", "failed") or time.time() > deadline:
        break
    time.sleep(0.5)
print(json.dumps(deployment.to_dict()))
"#;

#[tokio::test]
async fn a_client_generated_from_the_document_creates_deploys_and_reads_an_app() {
    let Platform { tmp, git, server } = start_platform(&[]).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "openapi-node", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();
    wait_for(Duration::from_secs(60), "the node ready", || async {
        let node = server.node(&agent.node_id).await.ok()?;
        (node["state"] == "ready").then_some(())
    })
    .await
    .unwrap();

    let (text, doc) = served_document(&server.http, &server.api("")).await;
    let document = tmp.path().join("openapi.json");
    std::fs::write(&document, text).unwrap();
    let pythonpath = generate_client(tmp.path(), &document);
    // One function module per operation, under its tag.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let module = pythonpath.join("cloudweb_client/api").join(op["tags"][0].as_str().unwrap()).join(format!("{}.py", op["operationId"].as_str().unwrap()));
            assert!(module.is_file(), "{method} {path}: no {}", module.display());
        }
    }

    let app = unique_name("gen");
    let commit = git.commit("genapp", &[("Dockerfile", DOCKERFILE)], "an app for the generated client").unwrap();
    let script = tmp.path().join("drive.py");
    std::fs::write(&script, CLIENT_SCRIPT).unwrap();
    let output = run(Command::new("python3")
        .arg(&script)
        .args([server.api("").as_str(), server.admin_token.as_str(), app.as_str(), git.url("genapp").as_str(), commit.as_str()])
        .env("PYTHONPATH", &pythonpath));
    let deployment: Value = serde_json::from_str(output.trim()).unwrap_or_else(|e| panic!("{e}: {output}"));
    assert_eq!(deployment["state"], "running", "{deployment}\nagent log:\n{}", agent.log_text());
    assert_eq!(deployment["app"], app.as_str());
    assert_eq!(deployment["commit"], commit.as_str());
    assert_eq!(deployment["instances"][0]["node_id"], agent.node_id.as_str(), "{deployment}");
    assert_eq!(deployment["instances"][0]["state"], "running", "{deployment}");

    // The server agrees with what the client read.
    let (status, listed) = server.call(reqwest::Method::GET, &format!("/api/apps/{app}/deployments"), None).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(listed["deployments"][0]["id"], deployment["id"]);
    assert_eq!(listed["deployments"][0]["state"], "running");
}
