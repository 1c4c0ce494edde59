//! The join command's installer: `/node.sh` and the agent it downloads.

use std::process::Command;

use cloudweb_e2e::{bin, ServerProcess};
use sha2::{Digest, Sha256};

#[tokio::test]
async fn the_join_command_fetches_a_script_that_pins_the_agent_binary() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(tmp.path()).await.unwrap();
    let (status, created) = server.call(reqwest::Method::POST, "/api/join-tokens", None).await.unwrap();
    assert_eq!(status, 201);
    let command = created["command"].as_str().unwrap();
    let script_url = command.split_whitespace().nth(2).unwrap();
    assert_eq!(script_url, server.api("/node.sh"));

    let script = reqwest::get(script_url).await.unwrap().text().await.unwrap();
    let binary = reqwest::get(server.api("/downloads/cloudweb-agent")).await.unwrap().bytes().await.unwrap();
    let on_disk = std::fs::read(bin("cloudweb-agent")).unwrap();
    assert_eq!(binary.as_ref(), on_disk.as_slice(), "serves the agent next to the server binary");
    let digest = hex::encode(Sha256::digest(&binary));
    assert!(script.contains(&format!("AGENT_SHA256='{digest}'")), "the script pins the binary's checksum");
    assert!(script.contains(&format!("AGENT_URL='{}'", server.api("/downloads/cloudweb-agent"))));
    assert!(!script.contains("@AGENT_"), "every placeholder is filled");

    // The script parses, and refuses to run where it cannot install a
    // service, before touching anything.
    let path = tmp.path().join("node.sh");
    std::fs::write(&path, &script).unwrap();
    let syntax = Command::new("sh").arg("-n").arg(&path).output().unwrap();
    assert!(syntax.status.success(), "{}", String::from_utf8_lossy(&syntax.stderr));
    let bad_option = Command::new("sh").arg(&path).arg("--bogus").output().unwrap();
    assert!(!bad_option.status.success());
    assert!(String::from_utf8_lossy(&bad_option.stderr).contains("unknown option: --bogus"));
}
