//! `cloudweb-layers`: run from the workspace root (or given it as the one
//! argument), checks that every crate under `crates/` depends only on
//! crates in a lower layer of `crates/layers/layers.toml`, and that no crate
//! has an import circle between its modules. Prints every violation and
//! exits 1 if there is any, 2 if it could not read what it checks.
//!
//! It reads text only (manifests and sources, no `cargo metadata`), so it
//! runs in a second, before anything is built.

mod circles;
mod config;
mod deps;
mod lexer;
mod modules;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use circles::Circle;
use deps::Manifest;

const TABLE: &str = "crates/layers/layers.toml";

#[derive(Debug, Default)]
struct Report {
    violations: Vec<String>,
    /// Circles allowed by a `[[circle_exception]]`, with its reason.
    excepted: Vec<String>,
    /// Declared crates that do not exist yet.
    absent: Vec<String>,
    crates: usize,
    layers: usize,
}

/// The root files of a crate's targets: its library, its binaries (the
/// default `src/main.rs`, `src/bin/`, and `[[bin]] path`) and its
/// integration tests.
fn target_roots(root: &Path, m: &Manifest) -> Vec<PathBuf> {
    let dir = root.join(&m.dir);
    let mut roots: Vec<PathBuf> = [m.lib_path.as_deref().unwrap_or("src/lib.rs"), "src/main.rs"].iter().map(|p| dir.join(p)).collect();
    roots.extend(m.bin_paths.iter().map(|p| dir.join(p)));
    for (folder, nested) in [("src/bin", true), ("tests", true)] {
        if let Ok(entries) = std::fs::read_dir(dir.join(folder)) {
            for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
                if path.extension().is_some_and(|e| e == "rs") {
                    roots.push(path);
                } else if nested && path.join("main.rs").is_file() {
                    roots.push(path.join("main.rs"));
                }
            }
        }
    }
    roots.retain(|p| p.is_file());
    roots.sort();
    roots.dedup();
    roots
}

fn describe(package: &str, target: &str, circle: &Circle) -> String {
    let mut out = format!("{package} ({target}): import circle between {}", circle.modules.join(", "));
    for (from, to, e) in &circle.edges {
        let more = if e.count > 1 { format!(", and {} more", e.count - 1) } else { String::new() };
        out.push_str(&format!("\n      {from} -> {to}: {}:{} `{}` into {}{more}", e.from_file, e.line, e.path, e.to_file));
    }
    out
}

fn run(root: &Path) -> Result<Report, String> {
    let table = root.join(TABLE);
    let text = std::fs::read_to_string(&table).map_err(|e| format!("{}: {e}", table.display()))?;
    let config = config::parse(&text).map_err(|e| format!("{TABLE}: {e}"))?;
    let manifests = deps::read_manifests(root)?;
    let mut report = Report { violations: deps::check(&config, &manifests), crates: manifests.len(), layers: config.layers.len(), ..Report::default() };
    report.absent = config.layers.iter().flatten().filter(|c| !manifests.iter().any(|m| &m.package == *c)).cloned().collect();
    let mut used = vec![false; config.circle_exceptions.len()];
    for m in &manifests {
        for target in target_roots(root, m) {
            let tree = modules::load(&target);
            report.violations.extend(tree.problems.iter().map(|p| format!("{}: {p}", m.package)));
            let shown = target.strip_prefix(root).unwrap_or(&target).display().to_string();
            for circle in circles::find(&tree, root) {
                let exception = config.circle_exceptions.iter().position(|x| x.krate == m.package && x.modules == circle.modules);
                match exception {
                    Some(n) => {
                        used[n] = true;
                        report.excepted.push(format!("{}\n      allowed by {TABLE}: {}", describe(&m.package, &shown, &circle), config.circle_exceptions[n].reason));
                    }
                    None => report.violations.push(describe(&m.package, &shown, &circle)),
                }
            }
        }
    }
    for (x, used) in config.circle_exceptions.iter().zip(used) {
        if !used {
            report.violations.push(format!("{TABLE}: the circle exception for {} between {} matches no circle any more: remove it", x.krate, x.modules.join(", ")));
        }
    }
    Ok(report)
}

fn main() -> ExitCode {
    let root = std::env::args_os().nth(1).map_or_else(|| PathBuf::from("."), PathBuf::from);
    let report = match run(&root) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("cloudweb-layers: {e}");
            return ExitCode::from(2);
        }
    };
    println!("cloudweb-layers: {} crates checked against {} layers ({TABLE})", report.crates, report.layers);
    if !report.absent.is_empty() {
        println!("  declared, not present yet: {}", report.absent.join(", "));
    }
    for x in &report.excepted {
        println!("  EXCEPTION {x}");
    }
    if report.violations.is_empty() {
        println!("  no upward dependency, no import circle");
        return ExitCode::SUCCESS;
    }
    eprintln!("cloudweb-layers: {} violation(s):", report.violations.len());
    for v in &report.violations {
        eprintln!("  - {v}");
    }
    ExitCode::from(1)
}

#[cfg(test)]
mod tests {
    use super::run;

    fn write(dir: &std::path::Path, files: &[(&str, &str)]) {
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    /// A workspace of two crates, `w-low` below `w-high`, and a layer table
    /// that also names a crate not written yet.
    fn clean(dir: &std::path::Path) {
        write(
            dir,
            &[
                ("Cargo.toml", "[workspace]\n[workspace.dependencies]\nw-low = { path = \"crates/low\" }\n"),
                ("crates/layers/layers.toml", "[[layer]]\ncrates = [\"w-low\", \"w-planned\"]\n[[layer]]\ncrates = [\"w-high\"]\n"),
                ("crates/low/Cargo.toml", "[package]\nname = \"w-low\"\n"),
                ("crates/low/src/lib.rs", "pub mod a;\npub mod b;\n"),
                ("crates/low/src/a.rs", "pub fn f() {}\n"),
                ("crates/low/src/b.rs", "use crate::a::f;\n"),
                ("crates/high/Cargo.toml", "[package]\nname = \"w-high\"\n[dependencies]\nw-low.workspace = true\n"),
                ("crates/high/src/main.rs", "mod cli;\nfn main() { cli::run() }\n"),
                ("crates/high/src/cli.rs", "pub fn run() { super::main_helper(); }\n"),
                ("crates/high/tests/t.rs", "mod common;\n"),
                ("crates/high/tests/common/mod.rs", "\n"),
            ],
        );
    }

    #[test]
    fn a_clean_workspace_passes() {
        let dir = tempfile::tempdir().unwrap();
        clean(dir.path());
        let report = run(dir.path()).unwrap();
        assert_eq!(report.violations, Vec::<String>::new());
        assert_eq!((report.crates, report.layers), (2, 2));
        assert_eq!(report.absent, ["w-planned"]);
    }

    #[test]
    fn an_upward_dependency_and_a_circle_fail() {
        let dir = tempfile::tempdir().unwrap();
        clean(dir.path());
        write(
            dir.path(),
            &[
                ("crates/low/Cargo.toml", "[package]\nname = \"w-low\"\n[dev-dependencies]\nw-high = { path = \"../high\" }\n"),
                ("crates/low/src/a.rs", "pub fn f() { crate::b::g() }\n"),
                ("crates/low/src/b.rs", "use crate::a::f;\npub fn g() {}\n"),
            ],
        );
        let report = run(dir.path()).unwrap();
        assert_eq!(report.violations.len(), 2, "{:#?}", report.violations);
        assert!(report.violations[0].contains("w-low (layer 1) depends on w-high (layer 2) in [dev-dependencies]"));
        let circle = &report.violations[1];
        assert!(circle.starts_with("w-low (crates/low/src/lib.rs): import circle between a, b"), "{circle}");
        assert!(circle.contains("a -> b: crates/low/src/a.rs:1 `crate::b::g` into crates/low/src/b.rs"), "{circle}");
        assert!(circle.contains("b -> a: crates/low/src/b.rs:1 `crate::a::f` into crates/low/src/a.rs"), "{circle}");
    }

    #[test]
    fn an_exception_allows_exactly_its_circle_and_must_stay_needed() {
        let dir = tempfile::tempdir().unwrap();
        clean(dir.path());
        let table = "[[layer]]\ncrates = [\"w-low\"]\n[[layer]]\ncrates = [\"w-high\"]\n\
                     [[circle_exception]]\ncrate = \"w-low\"\nmodules = [\"b\", \"a\"]\nreason = \"split pending\"\n";
        write(dir.path(), &[("crates/layers/layers.toml", table), ("crates/low/src/a.rs", "pub fn f() { crate::b::g() }\n")]);
        let report = run(dir.path()).unwrap();
        assert_eq!(report.violations, Vec::<String>::new());
        assert_eq!(report.excepted.len(), 1);
        assert!(report.excepted[0].contains("allowed by crates/layers/layers.toml: split pending"), "{}", report.excepted[0]);
        // A third module joining the circle is no longer the excepted one.
        write(
            dir.path(),
            &[
                ("crates/low/src/lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
                ("crates/low/src/b.rs", "use crate::c::h;\npub fn g() {}\n"),
                ("crates/low/src/c.rs", "use crate::a::f;\npub fn h() {}\n"),
            ],
        );
        let report = run(dir.path()).unwrap();
        assert_eq!(report.violations.len(), 2, "{:#?}", report.violations);
        assert!(report.violations[0].contains("import circle between a, b, c"));
        assert!(report.violations[1].contains("matches no circle any more"));
    }

    #[test]
    fn an_unreadable_table_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        clean(dir.path());
        write(dir.path(), &[("crates/layers/layers.toml", "[[layer]]\ncrates = \"w-low\"\n")]);
        assert!(run(dir.path()).unwrap_err().contains("crates must be an array of strings"));
    }
}
