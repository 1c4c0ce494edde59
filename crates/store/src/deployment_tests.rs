//! Tests of the deployment writes that span more than one row.

use crate::{AppRow, DeploymentRow, Rescheduled};

pub(crate) fn app() -> AppRow {
    AppRow {
        name: "web".into(),
        repo_url: "https://git.example/web.git".into(),
        branch: "main".into(),
        port: 8080,
        domains: "[]".into(),
        build: None,
        strategy: "auto".into(),
        instances: 2,
        cpu: None,
        memory_bytes: None,
        health_path: "/".into(),
        health_timeout_s: 30,
        build_timeout_s: None,
        env_sealed: None,
        git_credentials_sealed: None,
        created_at: 1,
        rollout: "blue-green".into(),
        liveness: None,
        readiness: None,
        team_id: "team_default".into(),
    }
}

fn deployment(id: &str, kind: &str, at: i64) -> DeploymentRow {
    DeploymentRow {
        id: id.into(),
        seq: 0,
        app: "web".into(),
        kind: kind.into(),
        commit_sha: None,
        rollback_of: None,
        state: "queued".into(),
        image: Some("registry/web:1".into()),
        error: None,
        created_at: at,
        updated_at: at,
    }
}

crate::test_engines::both_engines! {
    async fn a_lost_deployment_fails_only_together_with_its_reschedule(store) {
        store.insert_app(&app(), "web.example").await.unwrap().unwrap();
        store.insert_deployment(&deployment("d1", "source", 10), 2, true).await.unwrap();
        for (from, to) in [("queued", "deploying"), ("deploying", "running")] {
            assert!(store.transition_deployment("d1", from, to, None, None, 20).await.unwrap());
        }
        // A newer deployment on its way: the lost one is left running.
        store.insert_deployment(&deployment("d2", "source", 30), 2, true).await.unwrap();
        let again = DeploymentRow { rollback_of: Some("d1".into()), ..deployment("r1", "reschedule", 40) };
        assert!(matches!(store.fail_and_reschedule("d1", "lost", &again, 2).await.unwrap(), Rescheduled::NewerOnItsWay));
        assert_eq!(store.deployment("d1").await.unwrap().unwrap().state, "running");
        assert!(store.deployment("r1").await.unwrap().is_none());
        // That one fails: the failure and the reschedule are written at once.
        assert!(store.transition_deployment("d2", "queued", "failed", Some("build failed"), None, 50).await.unwrap());
        let Rescheduled::Queued(queued) = store.fail_and_reschedule("d1", "lost", &again, 2).await.unwrap() else { panic!("not queued") };
        let failed = store.deployment("d1").await.unwrap().unwrap();
        assert_eq!((failed.state.as_str(), failed.error.as_deref()), ("failed", Some("lost")));
        let newest = store.app_deployments("web").await.unwrap().remove(0);
        assert_eq!((newest.id.as_str(), newest.kind.as_str(), newest.state.as_str(), newest.seq), ("r1", "reschedule", "queued", queued.seq));
        assert!(queued.seq > failed.seq);
        let instances = store.instances("r1").await.unwrap();
        assert_eq!(instances.iter().map(|i| (i.instance, i.state.as_str())).collect::<Vec<_>>(), vec![(1, "pending"), (2, "pending")]);
        // A second pass (a restart that read the same state) adds nothing.
        let twice = DeploymentRow { id: "r2".into(), ..again };
        assert!(matches!(store.fail_and_reschedule("d1", "lost", &twice, 2).await.unwrap(), Rescheduled::NewerOnItsWay | Rescheduled::Ended));
        assert!(store.deployment("r2").await.unwrap().is_none());
        assert_eq!(store.app_deployments("web").await.unwrap().len(), 3);
    }
}

crate::test_engines::both_engines! {
    async fn unready_instances_leave_the_upstreams_unless_none_is_ready(store) {
        store.insert_app(&app(), "web.example").await.unwrap().unwrap();
        store.insert_deployment(&deployment("d1", "source", 10), 2, true).await.unwrap();
        for (instance, address) in [(1, "10.0.0.1:1"), (2, "10.0.0.1:2")] {
            let update = crate::InstanceUpdate::to("running").on("n1").address(Some(address));
            store.update_instance("d1", instance, update, 20).await.unwrap();
        }
        let upstreams = |mut all: Vec<String>| {
            all.sort();
            all
        };
        assert_eq!(upstreams(store.running_addresses_of("web").await.unwrap()), ["10.0.0.1:1", "10.0.0.1:2"]);
        // Only the node running it may change it, and only a change counts.
        assert_eq!(store.set_instance_readiness("d1", 1, "n2", false, Some("HTTP 503"), 30).await.unwrap(), None);
        assert_eq!(store.set_instance_readiness("d1", 1, "n1", false, Some("HTTP 503"), 30).await.unwrap().as_deref(), Some("web"));
        assert_eq!(store.set_instance_readiness("d1", 1, "n1", false, Some("again"), 31).await.unwrap(), None);
        assert_eq!(store.running_addresses_of("web").await.unwrap(), ["10.0.0.1:2"]);
        assert_eq!(store.running_addresses().await.unwrap(), [("web".to_string(), "10.0.0.1:2".to_string())]);
        assert_eq!(store.unready_instances("d1").await.unwrap(), [(1, 30, Some("HTTP 503".to_string()))]);
        // Both unready: both stay, rather than none.
        store.set_instance_readiness("d1", 2, "n1", false, None, 40).await.unwrap();
        assert_eq!(upstreams(store.running_addresses_of("web").await.unwrap()), ["10.0.0.1:1", "10.0.0.1:2"]);
        // Ready again.
        assert!(store.set_instance_readiness("d1", 1, "n1", true, None, 50).await.unwrap().is_some());
        assert_eq!(store.running_addresses_of("web").await.unwrap(), ["10.0.0.1:1"]);
    }
}

crate::test_engines::both_engines! {
    async fn crash_loops_and_probe_problems_are_kept_per_running_instance(store) {
        store.insert_app(&app(), "web.example").await.unwrap().unwrap();
        store.insert_deployment(&deployment("d1", "source", 10), 2, true).await.unwrap();
        store.update_instance("d1", 1, crate::InstanceUpdate::to("running").on("n1").address(Some("10.0.0.1:1")), 20).await.unwrap();
        // Only its node, and only a running instance.
        assert_eq!(store.set_instance_crash_loop("d1", 1, "n2", Some("{}")).await.unwrap(), None);
        assert_eq!(store.set_instance_crash_loop("d1", 2, "n1", Some("{}")).await.unwrap(), None);
        assert_eq!(store.set_instance_crash_loop("d1", 1, "n1", Some(r#"{"restarts":3}"#)).await.unwrap().as_deref(), Some("web"));
        assert_eq!(store.set_instance_crash_loop("d1", 1, "n1", Some(r#"{"restarts":3}"#)).await.unwrap(), None, "no change");
        assert_eq!(store.set_instance_probe_problem("d1", 1, "n1", Some("command not found")).await.unwrap().as_deref(), Some("web"));
        assert_eq!(store.crash_looping_counts().await.unwrap().get("web"), Some(&1));
        let troubles = store.instance_troubles("d1").await.unwrap();
        assert_eq!(troubles, [crate::InstanceTrouble { instance: 1, crash_loop: Some(r#"{"restarts":3}"#.into()), probe_problem: Some("command not found".into()) }]);
        assert!(store.set_instance_crash_loop("d1", 1, "n1", None).await.unwrap().is_some());
        assert!(store.set_instance_probe_problem("d1", 1, "n1", None).await.unwrap().is_some());
        assert!(store.instance_troubles("d1").await.unwrap().is_empty());
        assert!(store.crash_looping_counts().await.unwrap().is_empty());
    }
}
