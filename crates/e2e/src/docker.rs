//! The Docker CLI as the tests use it to look at what the agent left: every
//! call is checked, so a Docker that fails (daemon down, bad filter) fails
//! the test instead of reading as "no container".

use std::process::Command;

/// Runs `docker` with `args` (one argument each, no shell) and returns the
/// non-empty lines of its stdout. Panics, with Docker's stderr, when it
/// cannot be started or exits non-zero.
pub fn docker(args: &[&str]) -> Vec<String> {
    let output = Command::new("docker").args(args).output().unwrap_or_else(|e| panic!("docker {args:?} could not be started: {e}"));
    assert!(
        output.status.success(),
        "docker {args:?} failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect()
}

/// `docker ps <args>`: one line per container listed (ids with `-q`, or
/// whatever `--format` asks for). Panics when Docker fails.
pub fn ps(args: &[&str]) -> Vec<String> {
    let mut all = vec!["ps"];
    all.extend_from_slice(args);
    docker(&all)
}

/// Removes the untagged images labelled as `app`'s: the step images of
/// builds that did not finish and that the agent could not clean up at
/// once (a build cut off while the engine committed one more step). The
/// agent's pruner removes such images only once they are older than any
/// build may run (hours), so a test that cuts builds off removes its own.
/// Returns how many it removed.
pub fn remove_step_images_of(app: &str) -> usize {
    let ids = docker(&["images", "-q", "--no-trunc", "--filter", "dangling=true", "--filter", &format!("label=cloudweb.app={app}")]);
    for id in &ids {
        // Another build may have taken it as its cache meanwhile: kept then.
        let _ = std::process::Command::new("docker").args(["image", "rm", id]).output();
    }
    ids.len()
}

#[cfg(test)]
mod tests {
    #[test]
    #[should_panic(expected = "failed")]
    fn a_failing_docker_call_panics_instead_of_listing_nothing() {
        super::ps(&["-q", "--filter", "no-such-filter=x"]);
    }
}
