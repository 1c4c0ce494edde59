//! The join command's installer: `/node.sh` and the agent it downloads,
//! fetched the way the join command fetches them.

use std::process::Command;

use cloudweb_e2e::{bin, ServerProcess};
use sha2::{Digest, Sha256};

fn curl(args: &[&str]) -> std::process::Output {
    Command::new("curl").args(args).output().unwrap()
}

#[tokio::test]
async fn the_join_command_fetches_the_installer_only_from_the_pinned_key() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(tmp.path()).await.unwrap();
    let (status, created) = server.call(reqwest::Method::POST, "/api/join-tokens", None).await.unwrap();
    assert_eq!(status, 201);
    let command = created["command"].as_str().unwrap();
    let words: Vec<&str> = command.split_whitespace().collect();
    // curl -fsSL --insecure --pinnedpubkey PIN URL/node.sh | sudo sh -s -- --join ...
    assert_eq!(&words[..4], ["curl", "-fsSL", "--insecure", "--pinnedpubkey"]);
    let pin = words[4];
    let script_url = words[5];
    assert_eq!(script_url, format!("{}/node.sh", server.url()));
    assert!(pin.starts_with("sha256//"), "{pin}");

    let fetched = curl(&["-fsSL", "--insecure", "--pinnedpubkey", pin, script_url]);
    assert!(fetched.status.success(), "{}", String::from_utf8_lossy(&fetched.stderr));
    let script = String::from_utf8(fetched.stdout).unwrap();

    // A request head may be 8 KiB at most (the listener's read buffer
    // stays that size per connection): a larger one is refused, 431.
    for (size, status) in [(7000, "200"), (9000, "431")] {
        let header = format!("X-Padding: {}", "a".repeat(size));
        let answer = curl(&["-sS", "--insecure", "--pinnedpubkey", pin, "-o", "/dev/null", "-w", "%{http_code}", "-H", &header, script_url]);
        assert_eq!(String::from_utf8_lossy(&answer.stdout), status, "a {size}-byte header");
    }

    // Any other key is refused.
    let wrong_pin = "sha256//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    let refused = curl(&["-fsSL", "--insecure", "--pinnedpubkey", wrong_pin, script_url]);
    assert!(!refused.status.success());

    let binary = curl(&["-fsSL", "--insecure", "--pinnedpubkey", pin, &format!("{}/downloads/cloudweb-agent", server.url())]);
    assert!(binary.status.success());
    let on_disk = std::fs::read(bin("cloudweb-agent")).unwrap();
    assert!(binary.stdout == on_disk, "serves the agent next to the server binary");
    let digest = hex::encode(Sha256::digest(&binary.stdout));
    assert!(script.contains(&format!("AGENT_SHA256='{digest}'")), "the script pins the binary's checksum");
    assert!(script.contains(&format!("PIN='{pin}'")));
    assert!(script.contains(&format!("AGENT_URL='{}/downloads/cloudweb-agent'", server.url())));
    assert!(!script.contains("@AGENT_") && !script.contains("@PIN@"), "every placeholder is filled");

    // The pin survives a restart (the listener key persists).
    let (agent_port, api_port) = (server.agent_port, server.api_port);
    let mut server = server;
    server.process.kill();
    let server = ServerProcess::start_on(tmp.path(), agent_port, api_port, &[]).await.unwrap();
    let again = curl(&["-fsSL", "--insecure", "--pinnedpubkey", pin, &format!("{}/node.sh", server.url())]);
    assert!(again.status.success());

    // The script parses, and refuses unknown options before touching anything.
    let path = tmp.path().join("node.sh");
    std::fs::write(&path, &script).unwrap();
    let syntax = Command::new("sh").arg("-n").arg(&path).output().unwrap();
    assert!(syntax.status.success(), "{}", String::from_utf8_lossy(&syntax.stderr));
    let bad_option = Command::new("sh").arg(&path).arg("--bogus").output().unwrap();
    assert!(!bad_option.status.success());
    assert!(String::from_utf8_lossy(&bad_option.stderr).contains("unknown option: --bogus"));

    // Without wireguard-go (nothing on PATH) and without kernel WireGuard,
    // a join is refused before anything is downloaded or changed, saying
    // how to install it; with --no-mesh it gets past that check. (A host
    // whose kernel has the module passes it: the agent runs `auto`.)
    let empty_path = tmp.path().join("empty-path");
    std::fs::create_dir_all(&empty_path).unwrap();
    let join = ["--join", "https://192.0.2.1:8443", "--token", "t", "--ca-sha256", "00"];
    let refused = Command::new("/bin/sh").arg(&path).args(join).env("PATH", &empty_path).output().unwrap();
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    if std::path::Path::new("/sys/module/wireguard").exists() {
        assert!(!message.contains("wireguard-go"), "{message}");
    } else {
        assert!(message.contains("apt-get install wireguard-go") && message.contains("nothing was changed"), "{message}");
        assert!(refused.stdout.is_empty(), "{}", String::from_utf8_lossy(&refused.stdout));
    }
    let no_mesh = Command::new("/bin/sh").arg(&path).args(join).arg("--no-mesh").env("PATH", &empty_path).output().unwrap();
    assert!(!no_mesh.status.success());
    assert!(!String::from_utf8_lossy(&no_mesh.stderr).contains("wireguard-go"), "{}", String::from_utf8_lossy(&no_mesh.stderr));
    // A bad interface name from the environment is refused too.
    let bad_name = Command::new("/bin/sh").arg(&path).args(join).env("CLOUDWEB_MESH_INTERFACE", "-x").output().unwrap();
    assert!(String::from_utf8_lossy(&bad_name.stderr).contains("CLOUDWEB_MESH_INTERFACE"));
}
