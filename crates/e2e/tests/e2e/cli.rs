//! The `cloudweb` command line against a real control plane and a real
//! agent: golden `--json` output (ids, times, ports and machine figures
//! normalised), exit statuses (0 done, 1 failed, 2 usage), the stored
//! token's file, and `deploy --follow` ending 0 on running and 1 on a
//! mistyped branch.
//!
//! `CLOUDWEB_UPDATE_GOLDEN=1` rewrites the files under `tests/golden/cli/`
//! from this run instead of comparing.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use cloudweb_e2e::{bin, start_platform, unique_name, wait_for, AgentNode, Platform, ServerProcess};
use serde_json::{json, Map, Value};

const AGENT_FLAGS: [&str; 6] = ["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"];

const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nRUN mkdir -p /www && echo ok > /www/index.html\n\
CMD [\"sh\", \"-c\", \"echo 'hello from the cli app'; exec httpd -f -p 8080 -h /www\"]\n";

struct Cli {
    config_home: PathBuf,
    server: String,
}

struct Output {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Cli {
    /// Runs `cloudweb` with `args` (stdin from `input`, else empty).
    fn run(&self, args: &[&str], input: Option<&str>) -> Output {
        // Shown with --no-capture: where a failing run got to.
        eprintln!("cloudweb {}", args.join(" "));
        let mut child = Command::new(bin("cloudweb"))
            .args(args)
            .env("XDG_CONFIG_HOME", &self.config_home)
            .env("HOME", &self.config_home)
            .env("CLOUDWEB_SERVER", &self.server)
            .env_remove("CLOUDWEB_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        if let Some(input) = input {
            // A command that fails before reading stdin closes it.
            let _ = stdin.write_all(input.as_bytes());
        }
        drop(stdin);
        let output = child.wait_with_output().unwrap();
        Output {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Runs a command that must exit with `code`; returns its output.
    #[track_caller]
    fn expect(&self, code: i32, args: &[&str], input: Option<&str>) -> Output {
        let output = self.run(args, input);
        assert_eq!(output.code, code, "cloudweb {args:?}\nstdout: {}\nstderr: {}", output.stdout, output.stderr);
        output
    }

    #[track_caller]
    fn json(&self, args: &[&str]) -> Value {
        let output = self.expect(0, args, None);
        serde_json::from_str(&output.stdout).unwrap_or_else(|e| panic!("cloudweb {args:?}: not JSON ({e}): {}", output.stdout))
    }
}

/// Replaces what differs between runs and machines with placeholders.
struct Normalise {
    names: Vec<(String, String)>,
}

impl Normalise {
    fn value(&self, value: &Value) -> Value {
        match value {
            Value::String(text) => Value::String(self.text(text)),
            Value::Array(items) => Value::Array(items.iter().map(|v| self.value(v)).collect()),
            Value::Object(map) => {
                let mut out = Map::new();
                for (key, value) in map {
                    let value = match key.as_str() {
                        // Machine figures and the host's name.
                        "capacity" | "metrics" | "health_report" if !value.is_null() => json!("<present>"),
                        "hostname" => json!("<hostname>"),
                        "seq" => json!("<seq>"),
                        // The agent's release, so a version bump does not
                        // rewrite every golden file.
                        "version" if value == env!("CARGO_PKG_VERSION") => json!("<this release>"),
                        _ => self.value(value),
                    };
                    out.insert(key.clone(), value);
                }
                Value::Object(out)
            }
            other => other.clone(),
        }
    }

    fn text(&self, text: &str) -> String {
        let mut text = text.to_string();
        for (name, placeholder) in &self.names {
            text = text.replace(name.as_str(), placeholder);
        }
        let looks_like_time = text.len() >= 20 && text.as_bytes()[4] == b'-' && text.as_bytes()[10] == b'T' && text.ends_with('Z');
        if looks_like_time && text.bytes().take(4).all(|b| b.is_ascii_digit()) {
            return "<time>".into();
        }
        text = replace_runs(&text, "dep_", |c| c.is_ascii_hexdigit(), "dep_<id>");
        text = replace_runs(&text, "cwj_", |c| c.is_ascii_alphanumeric() || c == '-' || c == '_', "cwj_<token>");
        text = replace_runs(&text, "127.0.0.1:", |c| c.is_ascii_digit(), "127.0.0.1:<port>");
        text = replace_runs(&text, "sha256//", |c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '='), "sha256//<key pin>");
        text = replace_runs(&text, "n-", |c| c.is_ascii_hexdigit(), "n-<id>");
        // Whole words of hex: commits and fingerprints.
        text.split_inclusive(|c: char| !c.is_ascii_hexdigit())
            .map(|piece| {
                let word: String = piece.chars().take_while(char::is_ascii_hexdigit).collect();
                match word.len() {
                    40 => piece.replacen(&word, "<commit>", 1),
                    64 => piece.replacen(&word, "<sha256>", 1),
                    _ => piece.to_string(),
                }
            })
            .collect()
    }
}

/// Replaces each `prefix` followed by a run of at least 6 (1 for a port)
/// matching characters with `placeholder`.
fn replace_runs(text: &str, prefix: &str, run: impl Fn(char) -> bool, placeholder: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        out.push_str(&rest[..at]);
        let after = &rest[at + prefix.len()..];
        let length: usize = after.chars().take_while(|c| run(*c)).map(char::len_utf8).sum();
        let enough = if prefix.ends_with(':') { length >= 1 } else { length >= 6 };
        if enough {
            out.push_str(placeholder);
        } else {
            out.push_str(&rest[at..at + prefix.len() + length]);
        }
        rest = &after[length..];
    }
    out.push_str(rest);
    out
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/cli")
}

#[track_caller]
fn golden(name: &str, actual: &Value) {
    let path = golden_dir().join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(actual).unwrap() + "\n";
    if std::env::var_os("CLOUDWEB_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (CLOUDWEB_UPDATE_GOLDEN=1 writes it)", path.display()));
    assert_eq!(text, expected, "{name}: the --json output changed (CLOUDWEB_UPDATE_GOLDEN=1 rewrites {})", path.display());
}

async fn ready_node(server: &ServerProcess, node_id: &str) {
    wait_for(Duration::from_secs(60), "the node ready, healthy and with its usage sample", || async {
        let node = server.node(node_id).await.ok()?;
        (node["state"] == "ready" && node["health"] == "healthy" && !node["metrics"].is_null()).then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn the_cli_drives_a_real_cluster() {
    let Platform { tmp, git, server } = start_platform(&[]).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "cli-node", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();
    let node_id = agent.node_id.clone();
    let cli = Cli { config_home: tmp.path().join("config"), server: server.api("") };
    let app = unique_name("cli");
    let broken = unique_name("typo");
    let normalise = Normalise { names: vec![(broken.clone(), "<broken-app>".into()), (app.clone(), "<app>".into())] };

    // Usage errors: 2, before anything is sent.
    cli.expect(2, &["no-such-command"], None);
    cli.expect(2, &["apps", "create", "x", "--repo", "git://h/r.git", "--port", "0"], None);
    cli.expect(2, &["deploy", "x", "--commit", "not-hex"], None);
    cli.expect(2, &["logs", "x", "-n", "5000"], None);
    cli.expect(2, &["env", "set", "x", "1BAD=v"], None);
    cli.expect(0, &["--help"], None);
    // Not logged in: the action fails.
    let output = cli.expect(1, &["apps"], None);
    assert!(output.stderr.contains("cloudweb login"), "{}", output.stderr);

    // Login: a wrong token is refused and not stored; the right one is
    // stored 0600 in a 0700 directory and never printed.
    let output = cli.expect(1, &["login"], Some("wrong-token\n"));
    assert!(output.stderr.contains("HTTP 401"), "{}", output.stderr);
    let config = cli.config_home.join("cloudweb/config.json");
    assert!(!config.exists());
    cli.expect(2, &["login", "--server", "http://user:pw@127.0.0.1:1"], Some("x\n"));
    let output = cli.expect(0, &["login"], Some(&format!("{}\n", server.admin_token)));
    assert!(!output.stdout.contains(&server.admin_token) && !output.stderr.contains(&server.admin_token));
    assert_eq!(std::fs::metadata(&config).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(config.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
    assert!(std::fs::read_to_string(&config).unwrap().contains(&server.admin_token));

    ready_node(&server, &node_id).await;
    golden("nodes", &normalise.value(&cli.json(&["nodes", "--json"])));
    let table = cli.expect(0, &["nodes"], None).stdout;
    assert!(table.starts_with("NAME") && table.contains("cli-node") && table.contains("ready"), "{table}");
    golden("join-token", &normalise.value(&cli.json(&["nodes", "token", "--json"])));

    // Apps, variables, domains.
    let commit = git.commit("cliapp", &[("Dockerfile", DOCKERFILE)], "the cli app").unwrap();
    let repo = git.url("cliapp");
    cli.expect(0, &["apps", "create", &app, "--repo", &repo, "--port", "8080", "--health-timeout", "30", "--memory", "64M"], None);
    let output = cli.expect(1, &["apps", "create", &app, "--repo", &repo, "--port", "8080"], None);
    assert!(output.stderr.contains("already exists") && output.stderr.contains("HTTP 409"), "{}", output.stderr);
    cli.expect(0, &["apps", "create", &broken, "--repo", &repo, "--branch", "mian", "--port", "8080"], None);
    golden("apps", &normalise.value(&cli.json(&["apps", "--json"])));
    let secret = "s3cret-value-from-stdin";
    let output = cli.expect(0, &["env", "set", &app, "GREETING=hi", "API_KEY"], Some(&format!("{secret}\n")));
    assert!(!output.stdout.contains(secret) && !output.stderr.contains(secret));
    cli.expect(0, &["env", "set", &app, "DEBUG=1"], None);
    cli.expect(0, &["env", "unset", &app, "DEBUG"], None);
    golden("env", &cli.json(&["env", "list", &app, "--json"]));
    let www = format!("www.{app}.test");
    cli.expect(0, &["domains", "add", &app, &www, "api.example.test"], None);
    cli.expect(0, &["domains", "rm", &app, "api.example.test"], None);
    golden("domains", &normalise.value(&cli.json(&["domains", "list", &app, "--json"])));
    golden("certificates", &normalise.value(&cli.json(&["domains", "certificates", &app, "--json"])));
    let table = cli.expect(0, &["domains", "certs", &app], None).stdout;
    assert!(table.starts_with("HOST") && table.contains(&www) && table.contains("internal"), "{table}");
    cli.expect(1, &["domains", "add", &broken, &www], None);

    // Deploy --follow: 0 once running, with plain lines (stdout is a pipe).
    let output = cli.expect(0, &["deploy", &app, "--commit", &commit[..10], "--follow"], None);
    // Every state it passed through, in order, once each (issue 21 item
    // 13), read from its history: a cached build too.
    let states: Vec<&str> = output.stdout.lines().filter_map(|l| l.strip_prefix("state: ")).collect();
    assert_eq!(states, ["queued", "building", "deploying", "running"], "{}", output.stdout);
    assert!(output.stdout.contains("is running"), "{}", output.stdout);
    assert!(!output.stdout.contains('\u{1b}'), "no terminal codes when stdout is not a terminal: {}", output.stdout);
    // A mistyped branch: 1, with the reason.
    let output = cli.expect(1, &["deploy", &broken, "--follow"], None);
    assert!(output.stderr.contains("failed"), "{}", output.stderr);
    let failed = cli.json(&["deployments", &broken, "--json"]);
    assert_eq!(failed[0]["state"], "failed");
    golden("deployments", &normalise.value(&cli.json(&["deployments", &app, "--json"])));
    assert!(cli.expect(0, &["deployments", &app], None).stdout.starts_with("ID"));

    // Runtime logs.
    let lines = wait_for(Duration::from_secs(60), "the app's first line", || async {
        let output = cli.run(&["logs", &app, "--json"], None);
        let lines: Value = serde_json::from_str(&output.stdout).ok()?;
        (!lines.as_array()?.is_empty()).then_some(lines)
    })
    .await
    .unwrap();
    golden("logs", &normalise.value(&lines));
    let plain = cli.expect(0, &["logs", &app], None).stdout;
    assert!(plain.contains("hello from the cli app") && plain.contains(" stdout "), "{plain}");
    let mut follower = Command::new(bin("cloudweb"))
        .args(["logs", &app, "-f", "-n", "1"])
        .env("XDG_CONFIG_HOME", &cli.config_home)
        .env("CLOUDWEB_SERVER", &cli.server)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(follower.stdout.take().unwrap()), &mut first).unwrap();
    assert!(first.contains("hello from the cli app"), "{first}");
    follower.kill().unwrap();
    follower.wait().unwrap();

    // Rollback: none ran before; after a second deploy, back to the first.
    let output = cli.expect(1, &["rollback", &app], None);
    assert!(output.stderr.contains("no earlier deployment"), "{}", output.stderr);
    cli.expect(0, &["deploy", &app, "--follow"], None);
    let output = cli.expect(0, &["rollback", &app, "--follow", "--json"], None);
    let rolled: Value = serde_json::from_str(&output.stdout).unwrap();
    assert_eq!((rolled["kind"].as_str(), rolled["state"].as_str()), (Some("rollback"), Some("running")), "{rolled}");
    let output = cli.expect(1, &["rollback", &app, "--to", "dep_nope"], None);
    assert!(output.stderr.contains("HTTP 4"), "{}", output.stderr);

    // Nodes: drain lists what has nowhere to go, undrain, remove refused.
    golden("drain", &normalise.value(&cli.json(&["nodes", "drain", "cli-node", "--json"])));
    cli.expect(0, &["nodes", "undrain", &node_id], None);
    let output = cli.expect(1, &["nodes", "rm", "cli-node"], None);
    assert!(output.stderr.contains("HTTP 409"), "{}", output.stderr);
    cli.expect(1, &["nodes", "drain", "no-such-node"], None);

    // Deleting needs --yes without a terminal.
    cli.expect(2, &["apps", "rm", &app], None);
    cli.expect(0, &["apps", "rm", &app, "--yes"], None);
    cli.expect(0, &["apps", "rm", &broken, "--yes"], None);
    assert_eq!(cli.json(&["apps", "--json"]), json!([]));
    cli.expect(1, &["deployments", &app], None);
    cli.expect(0, &["logout"], None);
    assert!(!config.exists());
    agent.remove_containers();
}
