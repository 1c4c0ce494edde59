//! Static sites: optionally install and build in a builder image (with only
//! the public variables), then copy the output directory into a small
//! server image that serves it, with SPA fallback when asked for.

use std::path::Path;

use cloudweb_protocol::{BuildSettings, Spa};

use super::{context_archive, inside, spa_enabled, BuildError};
use crate::runtime::{DockerRuntime, OneShot};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticPlan {
    pub install_cmd: Option<String>,
    pub build_cmd: Option<String>,
    /// Decided after the build when the user did not set it.
    pub output_dir: Option<String>,
    pub spa: Spa,
    pub has_package_json: bool,
}

fn package_json(checkout: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(checkout.join("package.json")).ok()?;
    serde_json::from_str(&text).ok()
}

fn has_build_script(package: &serde_json::Value) -> bool {
    package.get("scripts").and_then(|s| s.get("build")).is_some_and(|b| b.is_string())
}

/// A static plan if the checkout looks like a static site (or the user set
/// build settings); `None` otherwise.
pub fn detect(checkout: &Path, settings: Option<&BuildSettings>) -> Result<Option<StaticPlan>, BuildError> {
    let package = package_json(checkout);
    let looks_static = settings.is_some() || package.as_ref().is_some_and(has_build_script) || checkout.join("index.html").is_file();
    if looks_static {
        Ok(Some(plan(checkout, settings)?))
    } else {
        Ok(None)
    }
}

/// The static plan, with what the user did not set filled in from the
/// checkout. The settings are checked again here: the agent does not trust
/// the control plane.
pub fn plan(checkout: &Path, settings: Option<&BuildSettings>) -> Result<StaticPlan, BuildError> {
    let settings = settings.cloned().unwrap_or_default();
    settings.validate().map_err(|e| BuildError::Invalid(e.to_string()))?;
    let package = package_json(checkout);
    let install_default = package.as_ref().map(|_| {
        if checkout.join("pnpm-lock.yaml").is_file() {
            "pnpm install --frozen-lockfile"
        } else if checkout.join("yarn.lock").is_file() {
            "yarn install --frozen-lockfile"
        } else if checkout.join("package-lock.json").is_file() {
            "npm ci"
        } else {
            "npm install"
        }
        .to_string()
    });
    let build_default = package.as_ref().filter(|p| has_build_script(p)).map(|_| "npm run build".to_string());
    Ok(StaticPlan {
        install_cmd: settings.install_cmd.or(install_default),
        build_cmd: settings.build_cmd.or(build_default),
        output_dir: settings.output_dir,
        spa: settings.spa.unwrap_or_default(),
        has_package_json: package.is_some(),
    })
}

/// Where the built site is when the user did not say.
fn default_output(checkout: &Path, plan: &StaticPlan) -> String {
    if plan.build_cmd.is_some() {
        for candidate in ["dist", "build", "out", "public"] {
            if checkout.join(candidate).is_dir() {
                return candidate.to_string();
            }
        }
    }
    ".".to_string()
}

pub struct StaticBuild<'a> {
    pub runtime: &'a DockerRuntime,
    pub checkout: &'a Path,
    pub plan: &'a StaticPlan,
    pub builder_image: &'a str,
    pub server_image: &'a str,
    pub port: u16,
    /// `NAME=value` of the public variables only.
    pub public_env: Vec<String>,
    pub tag: &'a str,
    /// Labels for the image (`cloudweb.commit`).
    pub labels: &'a [(&'a str, &'a str)],
}

pub async fn build_static_site(build: StaticBuild<'_>, mut log: impl FnMut(String, String)) -> Result<(), BuildError> {
    let steps: Vec<&str> = [build.plan.install_cmd.as_deref(), build.plan.build_cmd.as_deref()].into_iter().flatten().collect();
    if !steps.is_empty() {
        let script = steps.join(" && ");
        log("build".into(), format!("running in {}: {script}", build.builder_image));
        build
            .runtime
            .ensure_image(build.builder_image, None)
            .await
            .map_err(|e| BuildError::Failed(format!("builder image {}: {e}", build.builder_image)))?;
        let step = OneShot {
            image: build.builder_image.to_string(),
            command: vec!["sh".into(), "-c".into(), script],
            env: build.public_env.clone(),
            mount: build.checkout.display().to_string(),
        };
        let (code, output) = build.runtime.run_once(&step).await.map_err(|e| BuildError::Failed(e.to_string()))?;
        for (stream, line) in output {
            let _ = stream;
            log("build".into(), line);
        }
        if code != 0 {
            return Err(BuildError::Failed(format!("the site's build command exited with code {code}")));
        }
    }
    let output = build.plan.output_dir.clone().unwrap_or_else(|| default_output(build.checkout, build.plan));
    let site = inside(build.checkout, &output)?;
    if !site.join("index.html").is_file() {
        log("build".into(), format!("warning: {output}/index.html does not exist"));
    }
    let spa = spa_enabled(build.plan.spa, build.plan.has_package_json);
    let dockerfile = format!(
        "FROM {}\nCOPY site /site\nCMD [\"--root\", \"/site\", \"--listen\", \"0.0.0.0:{}\"{}]\n",
        build.server_image,
        build.port,
        if spa { ", \"--spa\"" } else { "" }
    );
    log("build".into(), format!("serving {output} (spa: {spa})"));
    let archive = context_archive(&site, "site", &[("Dockerfile", dockerfile.as_bytes())])?;
    build
        .runtime
        .build_image(archive, build.tag, build.labels, |line| log("build".into(), line))
        .await
        .map_err(|e| BuildError::Failed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_come_from_package_json() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("package.json"), r#"{"scripts": {"build": "vite build"}}"#).unwrap();
        std::fs::write(dir.path().join("package-lock.json"), "{}").unwrap();
        let detected = detect(dir.path(), None).unwrap().unwrap();
        assert_eq!(detected.install_cmd.as_deref(), Some("npm ci"));
        assert_eq!(detected.build_cmd.as_deref(), Some("npm run build"));
        assert!(detected.has_package_json);
        let explicit = BuildSettings { build_cmd: Some("npm run build:prod".into()), output_dir: Some("dist".into()), spa: Some(Spa::Yes), ..Default::default() };
        let planned = plan(dir.path(), Some(&explicit)).unwrap();
        assert_eq!(planned.build_cmd.as_deref(), Some("npm run build:prod"));
        assert_eq!(planned.output_dir.as_deref(), Some("dist"));
    }

    #[test]
    fn the_agent_checks_settings_again() {
        let dir = tempfile::tempdir().unwrap();
        let bad = BuildSettings { output_dir: Some("../../etc".into()), ..Default::default() };
        assert!(plan(dir.path(), Some(&bad)).is_err());
        let bad = BuildSettings { build_cmd: Some("make\nrm -rf /".into()), ..Default::default() };
        assert!(plan(dir.path(), Some(&bad)).is_err());
    }

    #[test]
    fn plain_html_is_static_without_build() {
        let dir = tempfile::tempdir().unwrap();
        assert!(detect(dir.path(), None).unwrap().is_none());
        std::fs::write(dir.path().join("index.html"), "<p>hi</p>").unwrap();
        let plan = detect(dir.path(), None).unwrap().unwrap();
        assert_eq!((plan.install_cmd.as_deref(), plan.build_cmd.as_deref()), (None, None));
        assert_eq!(default_output(dir.path(), &plan), ".");
    }
}
