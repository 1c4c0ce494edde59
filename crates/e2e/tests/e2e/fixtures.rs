//! The fixtures deploy tests stand on, checked against the real tools: the
//! git server really serves what was committed, and the locally built
//! Docker images really run (the busybox shell, and the static server
//! answering files, SPA routes and misses from a bind-mounted site).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use cloudweb_e2e::{ensure_images, git_command, run_command, wait_for, GitServer};

#[test]
fn git_server_serves_every_pushed_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let server = GitServer::start(tmp.path()).unwrap();
    assert_eq!(server.url("app"), format!("git://127.0.0.1:{}/app.git", server.port()));

    let first = server.commit("app", &[("index.html", "v1"), ("assets/app.js", "js")], "first").unwrap();
    let second = server.commit("app", &[("index.html", "v2"), ("about.html", "about")], "second").unwrap();
    assert_eq!(first.len(), 40, "{first}");
    assert_eq!(second.len(), 40, "{second}");
    assert_ne!(first, second);

    let clone = tmp.path().join("clone");
    run_command(git_command().args(["clone", "--quiet", "--", &server.url("app")]).arg(&clone)).unwrap();
    let git = |args: &[&str]| run_command(git_command().arg("-C").arg(&clone).args(args)).unwrap();
    assert_eq!(git(&["rev-parse", "HEAD"]), second);
    assert_eq!(git(&["rev-parse", "HEAD~1"]), first);
    assert_eq!(git(&["rev-parse", "--abbrev-ref", "HEAD"]), "main");
    assert_eq!(
        git(&["log", "--format=%an <%ae>|%cn <%ce>|%s", "-1"]),
        "cloud-web tests <tests@cloudweb.invalid>|cloud-web tests <tests@cloudweb.invalid>|second"
    );
    let read = |path: &str| std::fs::read_to_string(clone.join(path)).unwrap();
    assert_eq!(read("index.html"), "v2");
    assert_eq!(read("assets/app.js"), "js", "files from the first commit are kept");
    assert_eq!(read("about.html"), "about");

    // Repositories are independent, and names that could leave the base
    // path are refused before anything touches the disk.
    let other = server.commit("other", &[("README", "other")], "other").unwrap();
    assert_ne!(other, second);
    for bad in ["", "../app", "a/b", ".hidden"] {
        assert!(server.commit(bad, &[("x", "x")], "bad").is_err(), "{bad:?}");
    }
    assert!(server.commit("app", &[("../outside", "x")], "bad").is_err());
}

#[test]
fn busybox_image_runs_a_shell() {
    ensure_images().unwrap();
    let output = Command::new("docker")
        .args(["run", "--rm", "cloudweb-test/busybox:latest", "sh", "-c", "echo ok"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "ok");
}

/// A container removed (and killed) on drop.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "--force", &self.0]).output();
    }
}

fn docker(args: &[&str]) -> String {
    let output = Command::new("docker").args(args).output().unwrap();
    assert!(output.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn write(path: &Path, contents: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, contents).unwrap();
}

#[tokio::test]
async fn static_server_image_serves_a_site() {
    ensure_images().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let site = tmp.path().join("site");
    write(&site.join("index.html"), "<h1>home</h1>");
    write(&site.join("assets/app.js"), "console.log('app')");
    let mount = format!("{}:/site:ro", site.display());
    let id = docker(&[
        "run",
        "-d",
        "--rm",
        "-p",
        "127.0.0.1::8080",
        "-v",
        &mount,
        "cloudweb/static-server:latest",
        "--root",
        "/site",
        "--listen",
        "0.0.0.0:8080",
        "--spa",
    ]);
    let container = Container(id);
    let address = docker(&["port", &container.0, "8080/tcp"]);
    let address = address.lines().next().expect("a published port").to_string();
    let base = format!("http://{address}");

    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let get = |path: &str| {
        let request = http.get(format!("{base}{path}"));
        async move {
            let response = request.send().await?;
            let status = response.status().as_u16();
            let content_type =
                response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
            Ok::<_, reqwest::Error>((status, content_type, response.text().await?))
        }
    };
    let ready =
        wait_for(Duration::from_secs(15), "the static server to answer", || async { get("/").await.ok() }).await;
    let logs = || docker(&["logs", &container.0]);
    let (status, content_type, body) = ready.unwrap_or_else(|error| panic!("{error}\n{}", logs()));
    assert_eq!((status, content_type.as_str(), body.as_str()), (200, "text/html; charset=utf-8", "<h1>home</h1>"));

    let (status, content_type, body) = get("/assets/app.js").await.unwrap();
    assert_eq!(
        (status, content_type.as_str(), body.as_str()),
        (200, "text/javascript; charset=utf-8", "console.log('app')")
    );

    let (status, _, body) = get("/deep/link").await.unwrap();
    assert_eq!((status, body.as_str()), (200, "<h1>home</h1>"), "SPA fallback");

    let (status, _, _) = get("/missing.js").await.unwrap();
    assert_eq!(status, 404);
}
