//! Task runs without Docker: the numbering and cutting of lines, the
//! store of final reports, the decisions on what a command finds, the time
//! left of an adopted run, and whole runs against a stand-in Engine on a
//! unix socket (`engine`), their reports taken by a recorder.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_protocol::tasks::{container_name, MAX_LINE_BYTES, MAX_REPORT_LINES};
use cloudweb_protocol::{TaskLine, TaskRunReport, TaskState};
use futures_util::future::BoxFuture;
use serde_json::json;

use super::drive::{outcome, Ended, Sender};
use super::lines::Lines;
use super::store::{Finished, Store};
use super::*;

mod engine;

use engine::{Engine, Reply, Seen};

const RUN: &str = "tr_0123456789abcdef";
const SECRET: &str = "hunter2-very-secret";

/// Every report taken, in order; `failures` are the answers to the next
/// reports (taken ones answer Ok).
#[derive(Default)]
struct Recorder {
    reports: Mutex<Vec<(String, TaskRunReport)>>,
    failures: Mutex<VecDeque<ReportError>>,
    attempts: AtomicUsize,
    registry_asked: AtomicUsize,
}

impl Reporter for Recorder {
    fn report<'a>(&'a self, run_id: &'a str, report: &'a TaskRunReport) -> BoxFuture<'a, Result<(), ReportError>> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        let answer = self.failures.lock().unwrap().pop_front();
        if answer.is_none() {
            report.validate().expect("every report the agent sends is valid");
            self.reports.lock().unwrap().push((run_id.to_string(), report.clone()));
        }
        Box::pin(async move { answer.map_or(Ok(()), Err) })
    }

    fn registry(&self) -> BoxFuture<'_, Result<Option<RegistryAuth>, RegistryError>> {
        self.registry_asked.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(None) })
    }
}

impl Recorder {
    fn of(&self, run_id: &str) -> Vec<TaskRunReport> {
        self.reports.lock().unwrap().iter().filter(|(id, _)| id == run_id).map(|(_, r)| r.clone()).collect()
    }

    async fn final_report(&self, run_id: &str) -> TaskRunReport {
        for _ in 0..200 {
            if let Some(report) = self.of(run_id).into_iter().find(|r| r.state.is_final()) {
                return report;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no final report of {run_id}: {:?}", self.of(run_id));
    }

    /// Every line of the run's reports, by number (repeats merged).
    fn lines(&self, run_id: &str) -> Vec<TaskLine> {
        let mut lines: Vec<TaskLine> = self.of(run_id).into_iter().flat_map(|r| r.lines).collect();
        lines.sort_by_key(|l| l.seq);
        lines.dedup_by_key(|l| l.seq);
        lines
    }
}

fn transient(message: &str) -> ReportError {
    ReportError { permanent: false, message: message.into() }
}

struct Fixture {
    dir: tempfile::TempDir,
    tasks: Tasks,
    recorder: Arc<Recorder>,
    engine: Option<Engine>,
}

impl Fixture {
    /// No Docker Engine answers at all.
    fn without_engine() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let runtime = DockerRuntime::new(&format!("unix://{}", dir.path().join("no-docker.sock").display()), "n-test").unwrap();
        let recorder = Arc::new(Recorder::default());
        let tasks = Tasks::new(runtime, &dir.path().join("data"), recorder.clone());
        Fixture { dir, tasks, recorder, engine: None }
    }

    /// A stand-in Engine answers with `answer`.
    fn with_engine(answer: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("docker.sock");
        let engine = Engine::start(&socket, answer);
        let runtime = DockerRuntime::new(&format!("unix://{}", socket.display()), "n-test").unwrap();
        let recorder = Arc::new(Recorder::default());
        let tasks = Tasks::new(runtime, &dir.path().join("data"), recorder.clone());
        Fixture { dir, tasks, recorder, engine: Some(engine) }
    }

    fn engine(&self) -> &Engine {
        self.engine.as_ref().unwrap()
    }

    fn store(&self) -> Store {
        Store::new(&self.dir.path().join("data"))
    }

    async fn released(&self, run_id: &str) {
        for _ in 0..200 {
            if !self.tasks.is_busy(run_id) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the slot of {run_id} was not released");
    }
}

fn payload(run_id: &str, timeout_seconds: u32) -> serde_json::Value {
    json!({
        "run_id": run_id, "app": "web", "image": "10.0.0.1:5000/web:abc",
        "env": {"SECRET": SECRET, "MODE": "on"},
        "command": ["./manage.py", "migrate", "--noinput"],
        "timeout_seconds": timeout_seconds, "memory_bytes": 268435456u64, "cpu": 0.5,
    })
}

fn not_found() -> Reply {
    Reply::Json("404 Not Found", r#"{"message":"No such container"}"#.into())
}

/// Docker's inspection of this node's container of `RUN`.
fn inspected(status: &str, running: bool, exit_code: i64, started_at: &str, timeout: u32) -> String {
    json!({
        "Id": "c1", "Image": "sha256:img",
        "Config": {"Labels": {"cloudweb.node": "n-test", "cloudweb.role": "task", "cloudweb.task": RUN, "cloudweb.app": "web", "cloudweb.task-timeout": timeout.to_string()},
                   "Env": [format!("SECRET={SECRET}"), "MODE=on"]},
        "State": {"Status": status, "Running": running, "ExitCode": exit_code, "OOMKilled": false, "Error": "",
                  "StartedAt": started_at, "FinishedAt": "0001-01-01T00:00:00Z"},
    })
    .to_string()
}

#[test]
fn lines_are_numbered_from_one_and_cut_on_a_character_boundary() {
    let mut lines = Lines::default();
    lines.push(false, "2026-01-01T00:00:00.000000001Z", "first".into());
    lines.push(true, "2026-01-01T00:00:00.000000002Z", "second".into());
    // Three-byte characters across the limit: cut before the one that
    // would not fit whole.
    lines.push(false, "", "€".repeat(2000));
    let taken = lines.take(10);
    assert_eq!(taken.iter().map(|l| l.seq).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert!(!taken[0].stderr && taken[1].stderr);
    assert_eq!(taken[1].at, "2026-01-01T00:00:00.000000002Z");
    assert_eq!(taken[2].line.len(), MAX_LINE_BYTES - MAX_LINE_BYTES % 3);
    assert!(taken[2].line.chars().all(|c| c == '€'));
    // No timestamp from the Engine: now, in the protocol's form.
    assert!(taken[2].at.ends_with('Z') && taken[2].at.len() >= 20, "{}", taken[2].at);
    let report = TaskRunReport { state: TaskState::Running, exit_code: None, message: None, lines: taken };
    report.validate().unwrap();
}

#[test]
fn a_report_carries_at_most_its_bytes_of_text_and_the_final_one_keeps_the_newest() {
    let mut lines = Lines::default();
    let long = "x".repeat(MAX_LINE_BYTES);
    for _ in 0..100 {
        lines.push(false, "2026-01-01T00:00:00Z", long.clone());
    }
    assert!(!lines.fits_one_report(), "100 lines of 4 KiB are more than one report carries");
    let batch = lines.take(MAX_REPORT_LINES);
    let bytes: usize = batch.iter().map(|l| l.line.len()).sum();
    assert_eq!(batch.len(), cloudweb_protocol::tasks::MAX_REPORT_TEXT_BYTES / MAX_LINE_BYTES);
    let report = TaskRunReport { state: TaskState::Running, exit_code: None, message: None, lines: batch };
    report.validate().unwrap();
    assert!(serde_json::to_vec(&report).unwrap().len() < 1024 * 1024 / 2, "{bytes} bytes of text");
    lines.keep_fitting();
    assert!(lines.fits_one_report());
    assert_eq!(lines.take(MAX_REPORT_LINES).last().map(|l| l.seq), Some(100), "the newest lines stay for the final report");
    // A NUL byte (which PostgreSQL's text refuses) does not go out.
    lines.push(false, "2026-01-01T00:00:00Z", "a\0b".into());
    assert_eq!(lines.take(1)[0].line, "a\u{fffd}b");
}

#[test]
fn waiting_lines_are_bounded_and_failed_batches_come_back_in_order() {
    let mut lines = Lines::with_cap(5);
    for n in 1..=3 {
        lines.push(false, "t", format!("line {n}"));
    }
    let batch = lines.take(2);
    assert_eq!(batch.iter().map(|l| l.seq).collect::<Vec<_>>(), vec![1, 2]);
    for n in 4..=6 {
        lines.push(false, "t", format!("line {n}"));
    }
    // The report of 1 and 2 failed: they are older than what waits, and
    // the oldest goes when the queue is over its bound.
    lines.put_back(batch);
    assert_eq!(lines.len(), 5);
    assert_eq!(lines.dropped(), 1);
    assert_eq!(lines.take(3).iter().map(|l| l.seq).collect::<Vec<_>>(), vec![2, 3, 4]);
    lines.push(false, "t", "line 7".into());
    lines.keep_last(2);
    assert_eq!(lines.take(10).iter().map(|l| l.seq).collect::<Vec<_>>(), vec![6, 7]);
    assert_eq!((lines.numbered(), lines.dropped(), lines.is_empty()), (7, 2, true));
}

#[test]
fn final_reports_are_kept_private_then_without_their_lines_and_pruned() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path());
    let line = TaskLine { seq: 1, at: "t".into(), stderr: false, line: "done".into() };
    let report = TaskRunReport { state: TaskState::Succeeded, exit_code: Some(0), message: None, lines: vec![line] };
    let finished = Finished { finished_ms: 1, sent: false, report };
    store.put(RUN, &finished).unwrap();
    assert_eq!(store.get(RUN), Some(finished.clone()));
    assert_eq!(store.unsent(), vec![RUN.to_string()]);
    let path = dir.path().join(store::DIR).join(format!("{RUN}.json"));
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    store.mark_sent(RUN);
    let sent = store.get(RUN).unwrap();
    assert!(sent.sent && sent.report.lines.is_empty());
    assert_eq!(sent.report.exit_code, Some(0));
    assert!(store.unsent().is_empty());
    // Only run ids get a file.
    assert!(store.put("../escape", &finished).is_err());
    assert_eq!(store.get("../escape"), None);
    // Old records go, and files that are none once they are an hour old.
    std::fs::write(dir.path().join(store::DIR).join("junk.tmp"), "x").unwrap();
    let now = std::time::SystemTime::now();
    assert_eq!(store.prune(now), 0);
    assert_eq!(store.prune(now + store::KEEP + Duration::from_secs(60)), 2);
    assert_eq!(store.get(RUN), None);
}

#[test]
fn the_oldest_records_go_beyond_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::with_max(dir.path(), 5);
    let finished = Finished { finished_ms: 1, sent: true, report: final_report(TaskState::Succeeded, Some(0), None) };
    for n in 0..8u64 {
        store.put(&format!("tr_{n:016x}"), &finished).unwrap();
        // Distinct file times, oldest first.
        let path = dir.path().join(store::DIR).join(format!("tr_{n:016x}.json"));
        let at = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000 + n);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(at).unwrap();
    }
    let mut kept: Vec<String> = std::fs::read_dir(dir.path().join(store::DIR)).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    kept.sort();
    assert_eq!(kept.len(), 5);
    assert_eq!(kept[0], format!("tr_{:016x}.json", 3), "the oldest went");
}

#[test]
fn what_a_command_finds_under_the_runs_name_decides_what_it_does() {
    let ours = |status: &str, started: bool, error: Option<&str>| TaskContainer {
        id: "c1".into(),
        ours: true,
        status: status.into(),
        running: status == "running",
        started_at: started.then(|| "2026-01-01T00:00:00Z".to_string()),
        error: error.map(str::to_string),
        ..Default::default()
    };
    assert_eq!(plan(None), Plan::Create);
    assert_eq!(plan(Some(&TaskContainer { ours: false, ..ours("running", true, None) })), Plan::Foreign);
    assert_eq!(plan(Some(&ours("created", false, None))), Plan::Start);
    let refused = "exec: \"nope\": executable file not found in $PATH";
    assert_eq!(plan(Some(&ours("created", false, Some(refused)))), Plan::NeverStarted(refused.into()));
    assert_eq!(plan(Some(&ours("running", true, None))), Plan::Wait);
    assert_eq!(plan(Some(&ours("paused", true, None))), Plan::Wait);
    assert_eq!(plan(Some(&ours("exited", true, None))), Plan::Settle);
    assert_eq!(plan(Some(&ours("dead", true, None))), Plan::Settle);
    assert!(matches!(plan(Some(&ours("exited", false, None))), Plan::NeverStarted(_)));
}

#[test]
fn the_time_left_counts_from_the_containers_start() {
    let now = time::OffsetDateTime::parse("2026-01-01T12:00:00Z", &time::format_description::well_known::Rfc3339).unwrap();
    assert_eq!(remaining(60, Some("2026-01-01T11:59:50.123456789Z"), now), Duration::from_millis(50_123) + Duration::from_nanos(456_789));
    assert_eq!(remaining(60, Some("2026-01-01T11:00:00Z"), now), Duration::ZERO);
    assert_eq!(remaining(60, None, now), Duration::from_secs(60));
    assert_eq!(remaining(60, Some("garbage"), now), Duration::from_secs(60));
    // A start in the future (the clocks): the whole limit, not more.
    assert_eq!(remaining(60, Some("2026-01-01T12:05:00Z"), now), Duration::from_secs(60));
}

#[test]
fn final_states_say_how_the_run_ended() {
    assert_eq!(outcome(&Ended::Exited(0), false, 60, None), (TaskState::Succeeded, Some(0), None));
    assert_eq!(outcome(&Ended::Exited(3), false, 60, None), (TaskState::Failed, Some(3), Some("exited with code 3".into())));
    let (state, code, message) = outcome(&Ended::Exited(137), true, 60, Some(256 << 20));
    assert_eq!((state, code), (TaskState::Failed, Some(137)));
    assert!(message.unwrap().contains("ran out of memory (its limit is 256 MiB)"));
    assert_eq!(outcome(&Ended::TimedOut, false, 60, None), (TaskState::TimedOut, None, Some("stopped at its time limit of 60 s".into())));
    assert_eq!(outcome(&Ended::Cancelled("replaced".into()), false, 60, None), (TaskState::Cancelled, None, Some("replaced".into())));
    let (state, code, _) = outcome(&Ended::Gone, false, 60, None);
    assert_eq!((state, code), (TaskState::Failed, None));
}

#[tokio::test]
async fn an_invalid_task_run_is_dropped_and_reported_failed_when_it_names_a_run() {
    let fixture = Fixture::without_engine();
    let mut bad = payload(RUN, 60);
    bad["command"] = json!([]);
    assert!(matches!(fixture.tasks.run_command(bad).await, Taken::Invalid(_)));
    let report = fixture.recorder.final_report(RUN).await;
    assert_eq!(report.state, TaskState::Failed);
    assert_eq!(report.exit_code, None);
    assert!(report.message.as_deref().unwrap().starts_with("the agent refused the task: invalid command"), "{report:?}");
    // Named nowhere: nothing to report to.
    assert!(matches!(fixture.tasks.run_command(json!({"app": "web"})).await, Taken::Invalid(_)));
    assert!(matches!(fixture.tasks.cancel_command(json!({"run_id": "nope"})).await, Taken::Invalid(_)));
    assert_eq!(fixture.recorder.reports.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_run_that_ended_is_reported_again_not_run_again() {
    let fixture = Fixture::without_engine();
    let report = TaskRunReport { state: TaskState::Failed, exit_code: Some(2), message: Some("exited with code 2".into()), lines: Vec::new() };
    fixture.store().put(RUN, &Finished { finished_ms: 1, sent: true, report: report.clone() }).unwrap();
    // No Engine answers: had it looked for a container, it would retry.
    assert_eq!(fixture.tasks.run_command(payload(RUN, 60)).await, Taken::Finished);
    assert_eq!(fixture.recorder.final_report(RUN).await, report);
    // A cancel of it says how it ended, too.
    assert_eq!(fixture.tasks.cancel_command(json!({"run_id": RUN, "reason": "too late"})).await, Taken::Finished);
}

#[tokio::test]
async fn a_command_for_a_run_being_worked_on_changes_nothing() {
    let fixture = Fixture::without_engine();
    let (claim, mut cancel) = fixture.tasks.claim(RUN).unwrap();
    assert_eq!(fixture.tasks.run_command(payload(RUN, 60)).await, Taken::Busy);
    // A cancel reaches whatever works on the run.
    assert_eq!(fixture.tasks.cancel_command(json!({"run_id": RUN, "reason": "replaced by a newer run"})).await, Taken::Cancelled);
    cancel.changed().await.unwrap();
    assert_eq!(cancel.borrow().as_deref(), Some("replaced by a newer run"));
    assert!(fixture.recorder.reports.lock().unwrap().is_empty());
    drop(claim);
    assert!(!fixture.tasks.is_busy(RUN));
}

#[tokio::test]
async fn an_engine_that_does_not_answer_keeps_the_command_queued_until_the_limit() {
    let fixture = Fixture::without_engine();
    assert!(matches!(fixture.tasks.run_command(payload(RUN, 60)).await, Taken::Retry(_)));
    // The slot is free again for the next delivery.
    assert!(!fixture.tasks.is_busy(RUN));
    assert!(matches!(fixture.tasks.run_command(payload(RUN, 60)).await, Taken::Retry(_)));
    assert!(fixture.recorder.reports.lock().unwrap().is_empty());
    // Retried for longer than the limit: reported failed, acked.
    let long_ago = Instant::now().checked_sub(START_RETRY_LIMIT + Duration::from_secs(1)).unwrap();
    fixture.tasks.inner.retrying.lock().unwrap().insert(RUN.to_string(), long_ago);
    assert_eq!(fixture.tasks.run_command(payload(RUN, 60)).await, Taken::Failed);
    let report = fixture.recorder.final_report(RUN).await;
    assert!(report.message.as_deref().unwrap().starts_with("the agent could not start the task within 30 minutes"), "{report:?}");
    assert_eq!(fixture.tasks.run_command(payload(RUN, 60)).await, Taken::Finished);
    // A cancel needs the Engine too, to find a container.
    let other = "tr_00000000000000ff";
    assert!(matches!(fixture.tasks.cancel_command(json!({"run_id": other})).await, Taken::Retry(_)));
    assert!(!fixture.tasks.is_busy(other));
}

#[tokio::test]
async fn running_reports_give_failed_lines_back_and_stop_at_a_refusal() {
    let recorder = Arc::new(Recorder::default());
    let mut sender = Sender::new(recorder.clone(), RUN.into(), true);
    let mut lines = Lines::default();
    // Owed once, even without lines.
    sender.send_due(&mut lines);
    let (result, batch) = sender.in_flight().await;
    sender.settle(result, batch, &mut lines);
    assert_eq!(recorder.of(RUN).len(), 1);
    sender.send_due(&mut lines);
    assert_eq!(recorder.attempts.load(Ordering::SeqCst), 1, "nothing to send");
    for n in 0..(MAX_REPORT_LINES + 10) {
        lines.push(false, "t", format!("line {n}"));
    }
    recorder.failures.lock().unwrap().push_back(transient("connection refused"));
    sender.send_due(&mut lines);
    let (result, batch) = sender.in_flight().await;
    assert_eq!(batch.len(), MAX_REPORT_LINES);
    sender.settle(result, batch, &mut lines);
    assert_eq!(lines.len(), MAX_REPORT_LINES + 10, "the lines came back");
    // A pause after a failure.
    sender.send_due(&mut lines);
    assert_eq!(recorder.attempts.load(Ordering::SeqCst), 2);
    tokio::time::sleep(retry_pause(1) + Duration::from_millis(5)).await;
    sender.send_due(&mut lines);
    let (result, batch) = sender.in_flight().await;
    sender.settle(result, batch, &mut lines);
    assert_eq!(lines.len(), 10);
    assert_eq!(recorder.lines(RUN).first().map(|l| l.seq), Some(1));
    // Refused for good: no more running reports; the lines wait for the
    // final one.
    recorder.failures.lock().unwrap().push_back(ReportError { permanent: true, message: "404 no such run".into() });
    sender.send_due(&mut lines);
    let (result, batch) = sender.in_flight().await;
    sender.settle(result, batch, &mut lines);
    assert!(sender.refused);
    sender.send_due(&mut lines);
    assert_eq!((recorder.attempts.load(Ordering::SeqCst), lines.len()), (4, 10));
}

#[tokio::test]
async fn a_cancel_of_a_run_never_seen_keeps_it_from_starting() {
    let fixture = Fixture::with_engine(|request| if request.is("GET", "/containers/") { not_found() } else { Reply::Json("500 Internal Server Error", r#"{"message":"unexpected"}"#.into()) });
    assert_eq!(fixture.tasks.cancel_command(json!({"run_id": RUN, "reason": "the job was suspended"})).await, Taken::Cancelled);
    let report = fixture.recorder.final_report(RUN).await;
    assert_eq!((report.state, report.exit_code, report.message.as_deref()), (TaskState::Cancelled, None, Some("the job was suspended")));
    // Its task_run, coming later, reports that again and starts nothing.
    assert_eq!(fixture.tasks.run_command(payload(RUN, 60)).await, Taken::Finished);
    assert_eq!(fixture.engine().count("POST", "/containers/create"), 0);
    assert!(!fixture.tasks.is_busy(RUN));
}

#[tokio::test]
async fn a_start_docker_refuses_is_reported_failed_and_its_container_removed() {
    let fixture = Fixture::with_engine(|request| match (request.method.as_str(), request.target.as_str()) {
        ("GET", target) if target.starts_with("/containers/") => not_found(),
        ("GET", target) if target.starts_with("/images/") => Reply::Json("200 OK", "{}".into()),
        ("POST", target) if target.starts_with("/containers/create") => Reply::Json("201 Created", r#"{"Id":"c1","Warnings":[]}"#.into()),
        ("POST", "/containers/c1/start") => Reply::Json(
            "400 Bad Request",
            json!({"message": format!("failed to create task for container: exec: \"./manage.py\": executable file not found in $PATH (env {SECRET})")}).to_string(),
        ),
        ("DELETE", target) if target.starts_with("/containers/c1") => Reply::Empty,
        _ => Reply::Json("500 Internal Server Error", r#"{"message":"unexpected"}"#.into()),
    });
    assert_eq!(fixture.tasks.run_command(payload(RUN, 60)).await, Taken::Failed);
    let report = fixture.recorder.final_report(RUN).await;
    assert_eq!((report.state, report.exit_code), (TaskState::Failed, None));
    let message = report.message.unwrap();
    assert!(message.starts_with("the task's command could not be started: ") && message.contains("executable file not found"), "{message}");
    assert!(!message.contains(SECRET) && message.contains("[redacted SECRET]"), "{message}");
    assert_eq!(fixture.engine().count("DELETE", "/containers/c1"), 1);
    // The image was there: the registry was not asked.
    assert_eq!(fixture.recorder.registry_asked.load(Ordering::SeqCst), 0);

    // What the container was made of.
    let create = fixture.engine().requests().into_iter().find(|r| r.is("POST", "/containers/create")).unwrap();
    assert!(create.target.starts_with(&format!("/containers/create?name={}&", container_name(RUN))), "{}", create.target);
    let body: serde_json::Value = serde_json::from_str(&create.body).unwrap();
    assert_eq!(body["Cmd"], json!(["./manage.py", "migrate", "--noinput"]));
    assert_eq!(body["Image"], "10.0.0.1:5000/web:abc");
    assert_eq!(body["Env"], json!(["MODE=on", format!("SECRET={SECRET}")]));
    assert_eq!(body["Labels"]["cloudweb.node"], "n-test");
    assert_eq!(body["Labels"]["cloudweb.role"], "task");
    assert_eq!(body["Labels"]["cloudweb.task"], RUN);
    assert_eq!(body["Labels"]["cloudweb.app"], "web");
    assert_eq!(body["Labels"]["cloudweb.task-timeout"], "60");
    assert!(body["Labels"].get("cloudweb.deployment").is_none(), "no deployment's housekeeping may take it");
    assert_eq!(body["HostConfig"]["RestartPolicy"]["Name"], "no");
    assert_eq!(body["HostConfig"]["AutoRemove"], false);
    assert_eq!(body["HostConfig"]["Memory"], 268435456);
    assert_eq!(body["HostConfig"]["NanoCpus"], 500_000_000);
    assert!(body["HostConfig"].get("PortBindings").is_none() && body.get("ExposedPorts").is_none());
    assert!(body["HostConfig"].get("NetworkMode").is_none(), "the default network, as app instances");
    assert!(body.get("Entrypoint").is_none());
}

/// A container that prints two lines (one with a secret, one on stderr)
/// and exits 3 once `exit_after` passed.
fn engine_of_a_run(exit_after: Duration) -> impl Fn(&Seen) -> Reply + Send + Sync + 'static {
    let created = Arc::new(AtomicUsize::new(0));
    move |request| match (request.method.as_str(), request.target.as_str()) {
        ("GET", target) if target.starts_with(&format!("/containers/{}/json", container_name(RUN))) => not_found(),
        ("GET", "/containers/c1/json") => Reply::Json("200 OK", inspected("exited", false, 3, "2026-01-01T00:00:00Z", 60)),
        ("GET", target) if target.starts_with("/images/") => Reply::Json("200 OK", "{}".into()),
        ("POST", target) if target.starts_with("/containers/create") => {
            created.fetch_add(1, Ordering::SeqCst);
            Reply::Json("201 Created", r#"{"Id":"c1","Warnings":[]}"#.into())
        }
        ("POST", "/containers/c1/start") => Reply::Empty,
        ("GET", target) if target.starts_with("/containers/c1/logs") => Reply::Output(vec![
            (1, format!("2026-01-01T00:00:01.000000001Z migrating with {SECRET}")),
            (2, "2026-01-01T00:00:02.000000002Z warning: slow".to_string()),
        ]),
        ("POST", target) if target.starts_with("/containers/c1/wait") => {
            Reply::After(exit_after, Box::new(Reply::Json("200 OK", r#"{"StatusCode":3}"#.into())))
        }
        ("POST", target) if target.starts_with("/containers/c1/stop") => Reply::Empty,
        ("DELETE", target) if target.starts_with("/containers/c1") => Reply::Empty,
        _ => Reply::Json("500 Internal Server Error", r#"{"message":"unexpected"}"#.into()),
    }
}

#[tokio::test]
async fn a_run_is_followed_to_its_end_reported_and_removed() {
    let fixture = Fixture::with_engine(engine_of_a_run(Duration::from_millis(1500)));
    assert_eq!(fixture.tasks.run_command(payload(RUN, 60)).await, Taken::Started);
    // Delivered again while it runs: nothing happens.
    assert_eq!(fixture.tasks.run_command(payload(RUN, 60)).await, Taken::Busy);
    let report = fixture.recorder.final_report(RUN).await;
    assert_eq!((report.state, report.exit_code, report.message.as_deref()), (TaskState::Failed, Some(3), Some("exited with code 3")));
    let reports = fixture.recorder.of(RUN);
    assert_eq!(reports[0].state, TaskState::Running, "{reports:?}");
    assert_eq!(reports.iter().filter(|r| r.state.is_final()).count(), 1);
    let lines = fixture.recorder.lines(RUN);
    assert_eq!(lines.iter().map(|l| (l.seq, l.stderr)).collect::<Vec<_>>(), vec![(1, false), (2, true)]);
    assert_eq!(lines[0].line, "migrating with [redacted SECRET]");
    assert_eq!(lines[1].at, "2026-01-01T00:00:02.000000002Z");
    fixture.released(RUN).await;
    assert_eq!(fixture.engine().count("DELETE", "/containers/c1"), 1);
    assert_eq!(fixture.engine().count("POST", "/containers/create"), 1);
    let kept = fixture.store().get(RUN).unwrap();
    assert!(kept.sent && kept.report.lines.is_empty() && kept.report.exit_code == Some(3));
    // Delivered once more after its end: reported again, not run again.
    assert_eq!(fixture.tasks.run_command(payload(RUN, 60)).await, Taken::Finished);
    assert_eq!(fixture.engine().count("POST", "/containers/create"), 1);
}

#[tokio::test]
async fn a_run_is_stopped_at_its_time_limit_or_on_a_cancel() {
    let fixture = Fixture::with_engine(engine_of_a_run(Duration::from_secs(3600)));
    assert_eq!(fixture.tasks.run_command(payload(RUN, 1)).await, Taken::Started);
    let report = fixture.recorder.final_report(RUN).await;
    assert_eq!((report.state, report.exit_code), (TaskState::TimedOut, None));
    assert_eq!(report.message.as_deref(), Some("stopped at its time limit of 1 s"));
    assert_eq!(fixture.engine().count("POST", "/containers/c1/stop"), 1);
    fixture.released(RUN).await;
    assert_eq!(fixture.engine().count("DELETE", "/containers/c1"), 1);

    let fixture = Fixture::with_engine(engine_of_a_run(Duration::from_secs(3600)));
    assert_eq!(fixture.tasks.run_command(payload(RUN, 600)).await, Taken::Started);
    assert_eq!(fixture.tasks.cancel_command(json!({"run_id": RUN, "reason": "replaced by run tr_00000000000000ff"})).await, Taken::Cancelled);
    let report = fixture.recorder.final_report(RUN).await;
    assert_eq!((report.state, report.message.as_deref()), (TaskState::Cancelled, Some("replaced by run tr_00000000000000ff")));
    fixture.released(RUN).await;
    assert_eq!(fixture.engine().count("DELETE", "/containers/c1"), 1);
}

#[tokio::test]
async fn a_sweep_takes_up_a_running_container_with_the_time_it_has_left() {
    // Started 59 s ago with a limit of 60 s: about a second left.
    let started = (time::OffsetDateTime::now_utc() - time::Duration::seconds(59)).format(&time::format_description::well_known::Rfc3339).unwrap();
    let listed = json!([{"Id": "c1", "Names": [format!("/{}", container_name(RUN))], "State": "running",
                         "Labels": {"cloudweb.node": "n-test", "cloudweb.role": "task", "cloudweb.task": RUN}}])
    .to_string();
    let fixture = Fixture::with_engine(move |request| match (request.method.as_str(), request.target.as_str()) {
        ("GET", target) if target.starts_with("/containers/json") => Reply::Json("200 OK", listed.clone()),
        ("GET", "/containers/c1/json") => Reply::Json("200 OK", inspected("running", true, 0, &started, 60)),
        ("GET", target) if target.starts_with("/images/") => Reply::Json("200 OK", json!({"Config": {"Env": ["PATH=/bin"]}}).to_string()),
        ("GET", target) if target.starts_with("/containers/c1/logs") => Reply::Output(vec![(1, format!("2026-01-01T00:00:01Z {SECRET}"))]),
        ("POST", target) if target.starts_with("/containers/c1/wait") => Reply::Never,
        ("POST", target) if target.starts_with("/containers/c1/stop") => Reply::Empty,
        ("DELETE", target) if target.starts_with("/containers/c1") => Reply::Empty,
        _ => Reply::Json("500 Internal Server Error", r#"{"message":"unexpected"}"#.into()),
    });
    fixture.tasks.sweep().await;
    assert!(fixture.tasks.is_busy(RUN));
    // The command delivered again after the restart changes nothing.
    assert_eq!(fixture.tasks.run_command(payload(RUN, 60)).await, Taken::Busy);
    let report = fixture.recorder.final_report(RUN).await;
    assert_eq!(report.state, TaskState::TimedOut);
    assert_eq!(report.message.as_deref(), Some("stopped at its time limit of 60 s"));
    // Its variables, read from the container, are redacted all the same.
    assert_eq!(fixture.recorder.lines(RUN)[0].line, "[redacted SECRET]");
    assert_eq!(fixture.recorder.of(RUN)[0].state, TaskState::Running);
    fixture.released(RUN).await;
    assert_eq!(fixture.engine().count("POST", "/containers/create"), 0);
    assert_eq!(fixture.engine().count("DELETE", "/containers/c1"), 1);
}

#[tokio::test]
async fn a_final_report_that_did_not_go_out_goes_at_the_next_sweep() {
    let fixture = Fixture::with_engine(|request| {
        if request.is("GET", "/containers/json") {
            Reply::Json("200 OK", "[]".into())
        } else {
            not_found()
        }
    });
    for _ in 0..REPORT_TRIES {
        fixture.recorder.failures.lock().unwrap().push_back(transient("502 bad gateway"));
    }
    assert_eq!(fixture.tasks.cancel_command(json!({"run_id": RUN})).await, Taken::Cancelled);
    assert!(fixture.recorder.of(RUN).is_empty());
    assert!(!fixture.store().get(RUN).unwrap().sent);
    fixture.tasks.sweep().await;
    let report = fixture.recorder.final_report(RUN).await;
    assert_eq!((report.state, report.message.as_deref()), (TaskState::Cancelled, Some("cancelled")));
    for _ in 0..100 {
        if fixture.store().get(RUN).unwrap().sent {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the report was not noted as sent");
}
