//! The wire shapes that are easy to get wrong: which fields are left out
//! and which are `null`, and what `PATCH` bodies mean by each.

use serde_json::json;

use crate::apps::{AppPatch, CreateApp, DeployRequest, DeploymentQueued, GitLink};
use crate::git::{WebhookAnswer, WebhookIgnored};
use crate::ErrorBody;

#[test]
fn an_error_leaves_out_a_missing_code() {
    let body = ErrorBody { error: "no app \"web\"".into(), code: None };
    assert_eq!(serde_json::to_value(&body).unwrap(), json!({"error": "no app \"web\""}));
    let body: ErrorBody = serde_json::from_value(json!({"error": "gone", "code": "node_not_registered"})).unwrap();
    assert_eq!(body.code.as_deref(), Some("node_not_registered"));
}

#[test]
fn a_patch_tells_a_null_from_a_missing_field() {
    let patch: AppPatch = serde_json::from_value(json!({"cpu": null, "instances": 2})).unwrap();
    assert_eq!(patch.cpu, Some(None), "null: back to the default");
    assert_eq!(patch.memory, None, "missing: unchanged");
    assert_eq!(serde_json::to_value(&patch).unwrap(), json!({"cpu": null, "instances": 2}));
    assert!(serde_json::from_value::<AppPatch>(json!({"cpus": 1})).is_err(), "unknown fields are refused");
}

#[test]
fn requests_refuse_unknown_fields_and_leave_out_what_is_not_given() {
    assert!(serde_json::from_value::<CreateApp>(json!({"name": "web", "port": 80, "repo": "x"})).is_err());
    assert!(serde_json::from_value::<DeployRequest>(json!({"comit": "abc"})).is_err());
    assert_eq!(serde_json::to_value(DeployRequest::default()).unwrap(), json!({}));
    let create = CreateApp { name: "web".into(), repo_url: "https://g/w.git".into(), port: 8080, ..CreateApp::default() };
    assert_eq!(serde_json::to_value(&create).unwrap(), json!({"name": "web", "repo_url": "https://g/w.git", "port": 8080, "domains": []}));
}

#[test]
fn answers_keep_their_nulls() {
    let queued = DeploymentQueued { id: "dep_1".into(), state: "queued".into(), error: None };
    assert_eq!(serde_json::to_value(&queued).unwrap(), json!({"id": "dep_1", "state": "queued", "error": null}));
    let link = GitLink { provider: "generic".into(), project_id: None, project: None, account: None, webhook_registered: false, webhook: None };
    assert_eq!(
        serde_json::to_value(&link).unwrap(),
        json!({"provider": "generic", "project_id": null, "project": null, "account": null, "webhook_registered": false})
    );
}

#[test]
fn a_redelivery_names_its_deployment_even_when_there_is_none() {
    let plain = WebhookAnswer::Ignored(WebhookIgnored { ignored: "tag push".into(), deployment: None });
    assert_eq!(serde_json::to_value(&plain).unwrap(), json!({"ignored": "tag push"}));
    let redelivery = WebhookAnswer::Ignored(WebhookIgnored { ignored: "redelivery".into(), deployment: Some(None) });
    assert_eq!(serde_json::to_value(&redelivery).unwrap(), json!({"ignored": "redelivery", "deployment": null}));
    let back: WebhookAnswer = serde_json::from_value(json!({"ignored": "redelivery", "deployment": null})).unwrap();
    assert_eq!(back, redelivery);
}
