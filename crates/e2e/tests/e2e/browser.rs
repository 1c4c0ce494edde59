//! The dashboard in headless Chromium, driven over WebDriver (chromedriver
//! started by the test on a free port), against the real control plane and
//! a real agent with Docker, the registry, git and Caddy: log in as a user
//! (name and password, the accounts module's session), generate a
//! join token and join with its command's token, see the node ready and
//! healthy, create and deploy an app and watch its build log to running,
//! see the lines the app prints on its page (rendered, then live), open it
//! through the ingress, see a chart with a gap, drain (the app has
//! nowhere to go, so the page names it) and reactivate, switch to Spanish.
//! A screenshot of every page goes to `target/screenshots/`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cloudweb_e2e::{free_port, start_platform, unique_name, wait_for, AgentNode, Platform, Process};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nCOPY index.html /www/index.html\n\
CMD [\"sh\", \"-c\", \"echo serving-dashboard-app; (while sleep 2; do echo still-serving; done) & exec httpd -f -p 8080 -h /www\"]\n";

/// Where the screenshots go: `target/screenshots/` of this workspace.
fn screenshot_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

struct Browser {
    client: Client,
    base: String,
    _driver: Process,
}

impl Browser {
    async fn start(base: String, log_dir: &Path) -> Browser {
        let port = free_port();
        let driver = Process::spawn(Path::new("/usr/bin/chromedriver"), &[format!("--port={port}")], log_dir.join("chromedriver.log")).unwrap();
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900",
                         "--host-resolver-rules=MAP *.test 127.0.0.1", "--ignore-certificate-errors", "--lang=en-US"]
            }),
        );
        let client = wait_for(Duration::from_secs(30), "chromedriver to open a session", || {
            let capabilities = capabilities.clone();
            async move {
                let connector = hyper_util::client::legacy::connect::HttpConnector::new();
                ClientBuilder::new(connector).capabilities(capabilities).connect(&format!("http://127.0.0.1:{port}")).await.ok()
            }
        })
        .await
        .unwrap();
        Browser { client, base, _driver: driver }
    }

    async fn goto(&self, path: &str) {
        self.client.goto(&format!("{}{path}", self.base)).await.unwrap();
    }

    async fn text(&self, css: &str) -> String {
        self.client.find(Locator::Css(css)).await.unwrap().text().await.unwrap()
    }

    /// Clicks `css`. Live pages swap rows in place (the node table), so an
    /// element found a moment ago can be replaced before the click lands:
    /// find it again, a few times at most.
    async fn click(&self, css: &str) {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let element = self.client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}"));
            match element.click().await {
                Ok(()) => return,
                Err(fantoccini::error::CmdError::Standard(e)) if e.error == fantoccini::error::ErrorStatus::StaleElementReference && attempt < 5 => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("clicking {css}: {e}"),
            }
        }
    }

    /// Waits until `css` matches an element whose text contains `wanted`.
    async fn wait_text(&self, css: &str, wanted: &str, timeout: Duration) -> String {
        let found = wait_for(timeout, &format!("{css} to show {wanted:?}"), || async {
            let elements = self.client.find_all(Locator::Css(css)).await.ok()?;
            for element in elements {
                if let Ok(text) = element.text().await {
                    if text.contains(wanted) {
                        return Some(text);
                    }
                }
            }
            None
        })
        .await;
        match found {
            Ok(text) => text,
            Err(err) => panic!("{err}\npage:\n{}", self.client.source().await.unwrap_or_default()),
        }
    }

    /// The page renders in standards mode, not quirks mode (anything
    /// before the doctype, or none, gives `BackCompat`).
    async fn assert_standards_mode(&self, what: &str) {
        let mode = self.client.execute("return document.compatMode;", vec![]).await.unwrap();
        assert_eq!(mode.as_str(), Some("CSS1Compat"), "{what} renders in quirks mode");
    }

    async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        std::fs::write(screenshot_dir().join(format!("{name}.png")), png).unwrap();
    }
}

#[tokio::test]
async fn a_newcomer_joins_a_node_deploys_an_app_and_watches_it_in_the_browser() {
    let Platform { tmp, git, server } = start_platform(&["--base-domain", "test", "--heartbeat-flush-seconds", "1"]).await.unwrap();
    let browser = Browser::start(format!("http://127.0.0.1:{}", server.api_port), tmp.path()).await;

    // A user (made through the API with the admin token) logs in.
    let (status, user) = server.call(reqwest::Method::POST, "/api/users", Some(json!({"name": "ada", "password": "a long enough passphrase", "cluster_role": "cluster-admin"}))).await.unwrap();
    assert_eq!(status, 201, "{user}");
    browser.goto("/nodes").await;
    assert!(browser.client.current_url().await.unwrap().path().ends_with("/login"), "pages need a session");
    browser.client.find(Locator::Id("name")).await.unwrap().send_keys("ada").await.unwrap();
    browser.client.find(Locator::Id("password")).await.unwrap().send_keys("not the passphrase").await.unwrap();
    browser.click("form[action='/login'] button[type=submit]").await;
    browser.wait_text("p.flash.error", "Wrong name or password", Duration::from_secs(20)).await;
    browser.assert_standards_mode("the login page").await;
    browser.screenshot("01-login").await;
    browser.client.find(Locator::Id("name")).await.unwrap().send_keys("ada").await.unwrap();
    browser.client.find(Locator::Id("password")).await.unwrap().send_keys("a long enough passphrase").await.unwrap();
    browser.click("form[action='/login'] button[type=submit]").await;
    browser.wait_text("h1", "Nodes", Duration::from_secs(20)).await;
    assert!(browser.text("header.top").await.contains("ada"), "the page names who is logged in");
    browser.assert_standards_mode("the nodes page").await;

    // Generate a join token; the command it shows is what joins the node.
    browser.click("form[action='/nodes/join-token'] button").await;
    let command = browser.wait_text("#join-command", "--token cwj_", Duration::from_secs(10)).await;
    browser.screenshot("02-join-token").await;
    let word_after = |flag: &str| command.split_whitespace().skip_while(|w| *w != flag).nth(1).unwrap().to_string();
    let (token, ca) = (word_after("--token"), word_after("--ca-sha256"));
    assert!(command.contains(&format!("--join https://127.0.0.1:{}", server.agent_port)), "{command}");
    let mut agent = AgentNode::join(&server, &tmp.path().join("edge"), "edge", &token, &ca, &["--ingress"]).unwrap().unwrap();
    let (http_port, https_port) = (free_port(), free_port());
    let agent_args = [
        "--heartbeat-interval-seconds".to_string(), "1".into(), "--metrics-interval-seconds".into(), "2".into(),
        "--publish-ip".into(), "127.0.0.1".into(), "--advertise-host".into(), "127.0.0.1".into(),
        "--http-port".into(), http_port.to_string(), "--https-port".into(), https_port.to_string(),
        "--caddy-bin".into(), cloudweb_e2e::caddy_bin().display().to_string(),
    ];
    let agent_args: Vec<&str> = agent_args.iter().map(String::as_str).collect();
    agent.start(&agent_args).unwrap();

    // The table follows live (no reload): the node turns ready and healthy.
    let row = format!("tr[data-node='{}']", agent.node_id);
    let ready = format!("{row}[data-state='ready'][data-health='healthy']");
    wait_for(Duration::from_secs(60), "the node to show ready and healthy", || async {
        browser.client.find(Locator::Css(&ready)).await.ok()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_text()));
    let row_text = browser.text(&row).await;
    assert!(row_text.contains("edge") && row_text.contains("healthy") && row_text.contains("ready"), "{row_text}");
    browser.screenshot("03-nodes").await;

    // Create an app from a git URL, deploy it, watch the build log to running.
    let app = unique_name("hello");
    git.commit(&app, &[("Dockerfile", DOCKERFILE), ("index.html", "hello from the dashboard")], "first").unwrap();
    browser.goto("/apps").await;
    let form = browser.client.form(Locator::Css("form.create")).await.unwrap();
    form.set_by_name("name", &app).await.unwrap();
    form.set_by_name("repo_url", &git.url(&app)).await.unwrap();
    form.set_by_name("port", "8080").await.unwrap();
    browser.client.find(Locator::Css("#strategy")).await.unwrap().select_by_value("dockerfile").await.unwrap();
    browser.assert_standards_mode("the apps page").await;
    browser.screenshot("04-apps").await;
    form.submit().await.unwrap();
    browser.wait_text("h1", &app, Duration::from_secs(10)).await;
    browser.assert_standards_mode("the app page").await;
    browser.click("form[action$='/deploy'] button").await;
    browser.wait_text("h1", "Deployment", Duration::from_secs(10)).await;
    browser.assert_standards_mode("the deployment page").await;
    // Build lines arrive while the page is open, and the state, commit,
    // image and node follow from the same stream: the document marked
    // here stays the same one (no reload) until they have all changed.
    browser.client.execute("window.cwSamePage = true; return null;", vec![]).await.unwrap();
    let snapshot = "return { same: window.cwSamePage === true, lines: document.querySelectorAll('#log span.line').length, \
        state: document.querySelector('#deployment-state .badge').getAttribute('data-state'), \
        commit: document.getElementById('deployment-commit').textContent, image: document.getElementById('deployment-image').textContent, \
        instances: document.getElementById('deployment-instances').textContent };";
    let (client, agent_ref) = (&browser.client, &agent);
    let live = |wanted: fn(&serde_json::Value) -> bool| async move {
        let found = wait_for(Duration::from_secs(180), "the deployment page to update itself", || async {
            let now = client.execute(snapshot, vec![]).await.ok()?;
            (wanted(&now) || now["same"] != true).then_some(now)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", agent_ref.log_text()));
        assert_eq!(found["same"], true, "the page reloaded before showing it live: {found}");
        found
    };
    let building = live(|now| now["lines"].as_u64() > Some(0) && now["state"] == "building").await;
    browser.screenshot("05-deployment-building").await;
    let deploying = live(|now| now["image"] != "–" && now["commit"] != "–" && now["instances"].as_str().is_some_and(|i| i.contains("edge"))).await;
    assert!(matches!(deploying["state"].as_str(), Some("deploying" | "running")), "building: {building}, then: {deploying}");
    browser.wait_text("#deployment-state", "running", Duration::from_secs(180)).await;
    let timeline = browser.text("ol.timeline").await;
    assert!(timeline.contains("queued") && timeline.contains("building") && timeline.contains("running"), "{timeline}");
    browser.screenshot("06-deployment-running").await;
    // The app page shows what the app printed, and follows new lines live.
    browser.goto(&format!("/apps/{app}")).await;
    browser.wait_text("#runtime-log", "serving-dashboard-app", Duration::from_secs(60)).await;
    // The terminal's WebSocket needs the page's CSRF token: one without it
    // is refused before any session opens.
    let forged = format!(
        "var done = arguments[arguments.length - 1]; var ws = new WebSocket((location.protocol === 'https:' ? 'wss:' : 'ws:') + '//' + location.host + '/apps/{app}/terminal/session?csrf=forged&cols=80&rows=24'); ws.onopen = function () {{ done('opened'); }}; ws.onerror = function () {{ done('refused'); }};"
    );
    assert_eq!(browser.client.execute_async(&forged, vec![]).await.unwrap(), json!("refused"));
    browser.assert_standards_mode("the app page").await;
    let rendered = browser.client.find_all(Locator::Css("#runtime-log span.line")).await.unwrap().len();
    wait_for(Duration::from_secs(60), "new runtime lines to appear without a reload", || async {
        let now = browser.client.find_all(Locator::Css("#runtime-log span.line")).await.ok()?.len();
        (now > rendered + 1).then_some(())
    })
    .await
    .unwrap();
    let log_text = browser.text("#runtime-log").await;
    assert!(log_text.contains("still-serving"), "{log_text}");
    assert_eq!(log_text.matches("serving-dashboard-app").count(), 1, "a line the page shows is not appended again: {log_text}");
    browser.screenshot("07-app").await;

    // The terminal: a shell in the running instance, typed into in the
    // page, its answer read from the terminal's own buffer.
    browser.click("#open-terminal").await;
    browser.wait_text("#terminal-status", "Connected", Duration::from_secs(30)).await;
    let keys = browser.client.find(Locator::Css(".xterm-helper-textarea")).await.unwrap();
    keys.send_keys("echo cw-$((40+2))\u{E007}").await.unwrap();
    let screen = "var t = window.cwTerminal, b = t.buffer.active || t.buffer, out = []; for (var i = 0; i < b.length; i++) { var l = b.getLine(i); if (l) out.push(l.translateToString(true)); } return out.join('\\n');";
    let answered = wait_for(Duration::from_secs(30), "the shell's answer in the terminal", || async {
        let text = browser.client.execute(screen, vec![]).await.ok()?;
        text.as_str()?.lines().any(|l| l.trim() == "cw-42").then_some(())
    })
    .await;
    if let Err(e) = answered {
        panic!("{e}: {:?}", browser.client.execute(screen, vec![]).await);
    }
    browser.screenshot("07b-terminal").await;
    keys.send_keys("exit 3\u{E007}").await.unwrap();
    browser.wait_text("#terminal-status", "status 3", Duration::from_secs(30)).await;
    let (_, sessions) = server.call(reqwest::Method::GET, &format!("/api/apps/{app}/sessions"), None).await.unwrap();
    let recorded = &sessions["sessions"][0];
    assert_eq!((recorded["kind"].as_str(), recorded["program"].as_str(), recorded["tty"].as_bool(), recorded["exit_code"].as_i64()), (Some("exec"), Some("sh"), Some(true), Some(3)), "{sessions}");
    browser.goto(&format!("/apps/{app}")).await;

    // The app through the ingress, at the URL the dashboard shows.
    let url = browser.client.find(Locator::Css("main p a")).await.unwrap().attr("href").await.unwrap().unwrap();
    assert_eq!(url, format!("https://{app}.test/"));
    let through_ingress = format!("https://{app}.test:{https_port}/");
    let served = wait_for(Duration::from_secs(30), "the app to answer through the ingress", || async {
        browser.client.goto(&through_ingress).await.ok()?;
        let body = browser.client.find(Locator::Css("body")).await.ok()?.text().await.ok()?;
        body.contains("hello from the dashboard").then_some(body)
    })
    .await;
    served.unwrap_or_else(|e| panic!("{e}\n{}", agent.log_text()));
    browser.screenshot("08-app-through-ingress").await;

    // A gap: the agent stops for longer than a few sample periods.
    wait_for(Duration::from_secs(30), "two usage samples", || async {
        let (_, usage) = server.call(reqwest::Method::GET, &format!("/api/nodes/{}/usage", agent.node_id), None).await.ok()?;
        (usage["samples"].as_array()?.len() >= 2).then_some(())
    })
    .await
    .unwrap();
    agent.kill();
    tokio::time::sleep(Duration::from_secs(12)).await;
    agent.start(&agent_args).unwrap();
    let samples_before = server.call(reqwest::Method::GET, &format!("/api/nodes/{}/usage", agent.node_id), None).await.unwrap().1["samples"].as_array().unwrap().len();
    wait_for(Duration::from_secs(60), "usage samples after the restart", || async {
        let (_, usage) = server.call(reqwest::Method::GET, &format!("/api/nodes/{}/usage", agent.node_id), None).await.ok()?;
        (usage["samples"].as_array()?.len() >= samples_before + 2).then_some(())
    })
    .await
    .unwrap();
    // The node's charts are on its own page, linked from its row.
    browser.goto(&format!("/nodes/{}?range=1h", agent.node_id)).await;
    let cpu_chart = browser.client.find(Locator::Css("section[data-node='edge'] figure.chart svg")).await.unwrap();
    let points: usize = cpu_chart.attr("data-points").await.unwrap().unwrap().parse().unwrap();
    let segments: usize = cpu_chart.attr("data-segments").await.unwrap().unwrap().parse().unwrap();
    assert!(points >= 4 && segments >= 2, "a line with a gap: {points} points in {segments} runs");
    let gaps: usize = cpu_chart.attr("data-gaps").await.unwrap().unwrap().parse().unwrap();
    assert!(gaps >= 1, "the gap is shaded");
    // The pointer over the chart: the readout shows the values there.
    let read = browser
        .client
        .execute(
            "var figure = document.querySelector(\"section[data-node='edge'] figure.chart\");\
             var columns = figure.querySelectorAll('rect.hover'); var column = columns[columns.length - 2];\
             column.dispatchEvent(new PointerEvent('pointermove', {bubbles: true}));\
             return [figure.querySelector('.readout').textContent, column.querySelector('title').textContent];",
            vec![],
        )
        .await
        .unwrap();
    assert!(read[0] == read[1] && read[0].as_str().is_some_and(|t| t.contains("UTC")), "the readout follows the pointer: {read}");
    browser.assert_standards_mode("the node's page").await;
    browser.screenshot("09-node-charts").await;
    browser.goto("/monitoring?range=1h").await;
    browser.client.find(Locator::Css("figure.chart svg")).await.unwrap();
    browser.assert_standards_mode("the monitoring page").await;
    browser.screenshot("09-monitoring").await;

    // Drain: the only node, so the app cannot move and the page says so.
    wait_for(Duration::from_secs(30), "the node to be back", || async {
        browser.goto("/nodes").await;
        browser.client.find(Locator::Css(&ready)).await.ok()
    })
    .await
    .unwrap();
    browser.click(&format!("{row} a[href$='/drain']")).await;
    browser.wait_text("form.confirm p", "Drain this node?", Duration::from_secs(10)).await;
    browser.assert_standards_mode("a confirmation page").await;
    browser.screenshot("10-drain-confirm").await;
    browser.click("form.confirm button[type=submit]").await;
    let waiting = browser.wait_text(".flash", &app, Duration::from_secs(20)).await;
    assert!(waiting.contains("Could not be moved"), "{waiting}");
    browser.wait_text(&row, "draining", Duration::from_secs(10)).await;
    browser.screenshot("11-drained").await;
    browser.click(&format!("{row} a[href$='/undrain']")).await;
    browser.click("form.confirm button[type=submit]").await;
    browser.wait_text(&row, "ready", Duration::from_secs(20)).await;

    // Spanish, remembered across pages.
    browser.client.find(Locator::Css("#lang-select")).await.unwrap().select_by_value("es").await.unwrap();
    browser.click("form.lang button[type=submit]").await;
    browser.wait_text("h1", "Nodos", Duration::from_secs(10)).await;
    browser.wait_text(&row, "sana", Duration::from_secs(20)).await;
    browser.screenshot("12-nodos-es").await;
    browser.goto("/apps").await;
    browser.wait_text("h1", "Apps", Duration::from_secs(10)).await;
    assert!(browser.text("body").await.contains("Crear app"), "the choice is remembered");

    // At 360 px the pages still fit: no horizontal scroll of the page itself.
    browser.client.set_window_size(360, 800).await.unwrap();
    browser.goto("/nodes").await;
    let overflow = browser.client.execute("return document.documentElement.scrollWidth - window.innerWidth;", vec![]).await.unwrap();
    assert!(overflow.as_i64().unwrap_or(0) <= 0, "the page is wider than 360 px by {overflow}");
    // The header is one row (language and log-out behind the menu button),
    // and the node is a card: its Health line is on the screen.
    let fit = browser
        .client
        .execute(
            "var header = document.querySelector('header.top').getBoundingClientRect();\
             var health = document.querySelector('#node-rows tr[data-node] td.health').getBoundingClientRect();\
             return [header.height, health.left, health.right, health.width, window.innerWidth, document.documentElement.scrollWidth];",
            vec![],
        )
        .await
        .unwrap();
    let fit: Vec<f64> = fit.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let [header_height, health_left, health_right, health_width, inner_width, scroll_width] = fit[..] else { panic!("{fit:?}") };
    assert!(header_height < 60.0, "the header is {header_height} px high at 360 px: more than one row");
    assert!(health_width > 0.0 && health_left >= 0.0 && health_right <= inner_width, "the Health cell is off-screen: {fit:?}");
    assert!(scroll_width <= inner_width, "the page scrolls sideways: {fit:?}");
    browser.screenshot("13-nodos-360px").await;
    browser.click("header.top button.menu").await;
    assert!(browser.client.find(Locator::Css("#lang-select")).await.unwrap().is_displayed().await.unwrap(), "the menu shows the language switch");
    browser.screenshot("14-nodos-360px-menu").await;
    browser.goto("/monitoring?range=1h").await;
    let overflow = browser.client.execute("return document.documentElement.scrollWidth - window.innerWidth;", vec![]).await.unwrap();
    assert!(overflow.as_i64().unwrap_or(0) <= 0, "the monitoring page is wider than 360 px by {overflow}");
    browser.screenshot("15-monitorizacion-360px").await;

    // Error pages too: a page nothing serves, and a form refused for its
    // CSRF token (the session stays).
    browser.client.set_window_size(1280, 900).await.unwrap();
    browser.goto("/no-such-page").await;
    browser.wait_text("main", "No encontrado", Duration::from_secs(10)).await;
    browser.assert_standards_mode("the 404 page").await;
    browser.goto("/nodes").await;
    browser.client.execute("var form = document.querySelector('form.logout'); form.querySelector('[name=csrf_token]').value = 'forged'; form.submit(); return null;", vec![]).await.unwrap();
    wait_for(Duration::from_secs(10), "the 403 page", || async { browser.client.current_url().await.ok()?.path().ends_with("/logout").then_some(()) }).await.unwrap();
    browser.wait_text("main", "caducó", Duration::from_secs(10)).await;
    browser.assert_standards_mode("the 403 page").await;

    browser.client.clone().close().await.unwrap();
    agent.kill();
    agent.remove_containers();
}
