//! Issue 24 item 6, the registry on object storage, end to end with the
//! real binaries, Docker, the distribution registry and an S3-compatible
//! server (moto's): with `--registry-s3-*` a deploy's image goes to the
//! bucket under its prefix and nothing to the control plane's disk; the
//! secret key is in neither the registry's config file nor the server's
//! log; with the bucket gone, the next deploy fails within a bound, naming
//! the image it could not move, while the running one keeps serving.

use std::path::Path;
use std::time::{Duration, Instant};

use cloudweb_e2e::s3::{S3Server, ACCESS_KEY_ID, SECRET_ACCESS_KEY};
use cloudweb_e2e::services::AGENT_FLAGS;
use cloudweb_e2e::{start_platform, unique_name, wait_for, AgentNode, Platform, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\n\
CMD [\"sh\", \"-c\", \"mkdir -p /www && echo from-s3 > /www/index.html && exec httpd -f -p 8080 -h /www\"]\n";

async fn call(server: &ServerProcess, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    server.call(method, path, body).await.unwrap()
}

/// Waits until deployment `id` ends; its view.
async fn settled(server: &ServerProcess, agent: &AgentNode, id: &str, limit: Duration) -> Value {
    wait_for(limit, &format!("deployment {id} to settle"), || async {
        let (_, d) = server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
        matches!(d["state"].as_str(), Some("running" | "failed" | "cancelled" | "superseded")).then_some(d)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()))
}

/// Every regular file under `dir`.
fn files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files(&path));
        } else {
            found.push(path.display().to_string());
        }
    }
    found
}

#[tokio::test]
async fn the_registry_keeps_images_in_an_s3_bucket_and_a_bucket_gone_fails_the_next_deploy_in_words() {
    let mut s3 = S3Server::start().await;
    s3.create_bucket("images").await;
    let scratch = tempfile::tempdir().unwrap();
    let secret_file = scratch.path().join("registry-s3-secret");
    std::fs::write(&secret_file, format!("{SECRET_ACCESS_KEY}\n")).unwrap();
    let endpoint = s3.endpoint();
    let secret_path = secret_file.to_string_lossy().into_owned();
    let flags = [
        "--registry-s3-bucket",
        "images",
        "--registry-s3-endpoint",
        &endpoint,
        "--registry-s3-prefix",
        "cluster-one",
        "--registry-s3-access-key-id",
        ACCESS_KEY_ID,
        "--registry-s3-secret-access-key-file",
        &secret_path,
    ];
    let Platform { tmp, git, server } = start_platform(&flags).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "s3-node", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();

    git.commit("on-s3", &[("Dockerfile", DOCKERFILE)], "first").unwrap();
    let app = unique_name("s3app");
    let (status, body) = call(&server, Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": git.url("on-s3"), "port": 8080}))).await;
    assert_eq!(status, 201, "{body}");
    let started = Instant::now();
    let (status, body) = call(&server, Method::POST, &format!("/api/apps/{app}/deploy"), None).await;
    assert_eq!(status, 201, "{body}");
    let first = settled(&server, &agent, body["id"].as_str().unwrap(), Duration::from_secs(180)).await;
    assert_eq!(first["state"], "running", "{first}\nagent log:\n{}", agent.log_text());
    eprintln!("first deploy with the registry on S3: {:.1} s", started.elapsed().as_secs_f64());

    // The image is in the bucket, under the prefix; nothing on local disk.
    let keys = s3.keys("images", "cluster-one/docker/registry/v2/").await;
    assert!(keys.iter().any(|k| k.contains("/blobs/sha256/")), "blobs in the bucket: {keys:?}");
    assert!(keys.iter().any(|k| k.contains(&format!("/repositories/{app}/_manifests/"))), "the app's manifest in the bucket: {keys:?}");
    let registry_dir = server.dir.join("server").join("registry");
    assert!(registry_dir.join("storage").is_dir(), "the registry's directory is where this test looks");
    let local = files(&registry_dir.join("storage"));
    assert!(local.is_empty(), "nothing stored under the data dir: {local:?}");
    // The secret in neither the registry's config file nor the server's log.
    let config = std::fs::read_to_string(registry_dir.join("config.yml")).unwrap();
    assert!(config.contains("bucket: \"images\"") && config.contains("disable: true"), "{config}");
    assert!(!config.contains(SECRET_ACCESS_KEY), "the config file holds no secret");
    assert!(!server.process.log_text().contains(SECRET_ACCESS_KEY), "the server's log holds no secret");
    let address = first["instances"][0]["address"].as_str().unwrap().to_string();
    let page = reqwest::get(format!("http://{address}/")).await.unwrap().text().await.unwrap();
    assert_eq!(page.trim(), "from-s3");

    // The bucket goes away: a new build cannot be pushed, and its
    // deployment fails saying so, within a bound; the running one serves on.
    s3.stop().await;
    git.commit("on-s3", &[("Dockerfile", &DOCKERFILE.replace("from-s3", "second"))], "second").unwrap();
    let asked = Instant::now();
    let (status, body) = call(&server, Method::POST, &format!("/api/apps/{app}/deploy"), None).await;
    assert_eq!(status, 201, "{body}");
    let second = settled(&server, &agent, body["id"].as_str().unwrap(), Duration::from_secs(300)).await;
    eprintln!("deploy with the bucket gone ended {} in {:.1} s: {}", second["state"], asked.elapsed().as_secs_f64(), second["error"]);
    assert_eq!(second["state"], "failed", "{second}");
    let reason = second["error"].as_str().unwrap_or_default();
    assert!(reason.contains("pull of") || reason.contains("push of"), "a reason that names what failed: {second}");
    assert!(!second.to_string().contains(SECRET_ACCESS_KEY));
    let page = reqwest::get(format!("http://{address}/")).await.unwrap().text().await.unwrap();
    assert_eq!(page.trim(), "from-s3", "the running deployment serves on");
    let (status, _) = call(&server, Method::GET, "/api/apps", None).await;
    assert_eq!(status, 200, "the control plane answers");
}
