//! Git over smart HTTP for the git host stand-ins (`gitlab.rs`,
//! `github.rs`): `git http-backend` run as a CGI program over a directory
//! of bare repositories, once the stand-in has checked the credentials.

use std::path::Path;
use std::process::Stdio;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use anyhow::Result;
use base64::Engine;
use tokio::io::AsyncWriteExt;

use crate::{git_command, run_command};

/// `user:password` of a Basic `Authorization` header.
pub fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.split_once(':').map(|(u, p)| (u.to_string(), p.to_string())))
}

/// Makes the bare repository `<root>/repos/<path>.git`.
pub fn init_bare(root: &Path, path: &str) -> Result<()> {
    let bare = root.join("repos").join(format!("{path}.git"));
    std::fs::create_dir_all(bare.parent().unwrap())?;
    run_command(git_command().args(["init", "--quiet", "--bare", "--initial-branch=main", "--"]).arg(&bare))?;
    Ok(())
}

/// Commits `files` on `branch` of `<root>/repos/<path>.git` through a
/// work tree under `<root>/work` (the branch starts from main when new)
/// and pushes; returns the commit id.
pub fn commit(root: &Path, path: &str, branch: &str, files: &[(&str, &str)], message: &str) -> Result<String> {
    let bare = root.join("repos").join(format!("{path}.git"));
    let work = root.join("work").join(path.replace('/', "__"));
    if !work.exists() {
        std::fs::create_dir_all(work.parent().unwrap())?;
        run_command(git_command().args(["-c", "init.defaultBranch=main", "clone", "--quiet", "--"]).arg(&bare).arg(&work))?;
    }
    let has_commits = run_command(git_command().arg("-C").arg(&work).args(["rev-parse", "--verify", "HEAD"])).is_ok();
    if has_commits {
        run_command(git_command().arg("-C").arg(&work).args(["fetch", "--quiet", "origin"]))?;
        let remote_branch = format!("origin/{branch}");
        let start = if run_command(git_command().arg("-C").arg(&work).args(["rev-parse", "--verify", &remote_branch])).is_ok() { remote_branch } else { "origin/main".into() };
        run_command(git_command().arg("-C").arg(&work).args(["checkout", "--quiet", "-B", branch, &start]))?;
    } else {
        run_command(git_command().arg("-C").arg(&work).args(["checkout", "--quiet", "-B", branch]))?;
    }
    for (file, contents) in files {
        let target = work.join(file);
        std::fs::create_dir_all(target.parent().unwrap())?;
        std::fs::write(target, contents)?;
    }
    run_command(git_command().arg("-C").arg(&work).args(["add", "--all"]))?;
    run_command(
        git_command()
            .arg("-C")
            .arg(&work)
            .args(["-c", "user.name=Stand-in", "-c", "user.email=stand-in@git.test", "commit", "--quiet", "--allow-empty", "--message", message]),
    )?;
    run_command(git_command().arg("-C").arg(&work).args(["push", "--quiet", "origin", &format!("HEAD:refs/heads/{branch}")]))?;
    run_command(git_command().arg("-C").arg(&work).args(["rev-parse", "HEAD"]))
}

/// Serves one request of a clone or fetch from `repos` as `remote_user`.
pub async fn serve(repos: &Path, method: Method, uri: &Uri, headers: &HeaderMap, body: Bytes, remote_user: &str) -> Response {
    let path = uri.path();
    let mut command = tokio::process::Command::new("git");
    command
        .arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", repos)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("PATH_INFO", path)
        .env("REQUEST_METHOD", method.as_str())
        .env("QUERY_STRING", uri.query().unwrap_or(""))
        .env("CONTENT_TYPE", headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or(""))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("REMOTE_USER", remote_user)
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if let Some(encoding) = headers.get("content-encoding").and_then(|v| v.to_str().ok()) {
        command.env("HTTP_CONTENT_ENCODING", encoding);
    }
    if let Some(protocol) = headers.get("git-protocol").and_then(|v| v.to_str().ok()) {
        command.env("GIT_PROTOCOL", protocol);
    }
    let Ok(mut child) = command.spawn() else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let mut stdin = child.stdin.take().unwrap();
    let writer = tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
    });
    let Ok(output) = child.wait_with_output().await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let _ = writer.await;
    let raw = output.stdout;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4)).or_else(|| raw.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)));
    let Some((end, gap)) = split else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let head = String::from_utf8_lossy(&raw[..end]).to_string();
    let mut response = Response::new(Body::from(raw[end + gap..].to_vec()));
    for line in head.lines() {
        let Some((name, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            if let Some(code) = value.split_whitespace().next().and_then(|c| c.parse::<u16>().ok()) {
                *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
            }
        } else if let (Ok(name), Ok(value)) = (axum::http::HeaderName::try_from(name), axum::http::HeaderValue::try_from(value)) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}
