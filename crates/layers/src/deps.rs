//! The workspace's crates (`crates/*/Cargo.toml`), their dependencies on one
//! another (normal, build and dev, target-specific tables included), and
//! the layer rule: a crate depends only on crates in a strictly lower layer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, Item};

use crate::config::Config;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dep {
    pub package: String,
    /// `dependencies`, `dev-dependencies`, `build-dependencies`, or one of
    /// them under `target.'cfg(…)'`.
    pub table: String,
}

#[derive(Debug)]
pub struct Manifest {
    pub package: String,
    /// The crate's folder, relative to the workspace root.
    pub dir: PathBuf,
    pub deps: Vec<Dep>,
    /// Root files of its targets, relative to `dir`: `[lib] path` and
    /// `[[bin]] path` where given.
    pub lib_path: Option<String>,
    pub bin_paths: Vec<String>,
}

const KINDS: [&str; 3] = ["dependencies", "dev-dependencies", "build-dependencies"];

fn read(path: &Path) -> Result<DocumentMut, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.parse().map_err(|e| format!("{}: {e}", path.display()))
}

/// The package a dependency entry stands for: its `package = "…"` key, or
/// the workspace's for `workspace = true`, else its own name.
fn package_of(key: &str, item: &Item, workspace: &BTreeMap<String, String>) -> String {
    let table = item.as_table_like();
    if let Some(package) = table.and_then(|t| t.get("package")).and_then(Item::as_str) {
        return package.to_string();
    }
    if table.and_then(|t| t.get("workspace")).and_then(Item::as_bool) == Some(true) {
        if let Some(package) = workspace.get(key) {
            return package.clone();
        }
    }
    key.to_string()
}

fn deps_in(table: &Item, prefix: &str, workspace: &BTreeMap<String, String>, out: &mut Vec<Dep>) {
    for kind in KINDS {
        if let Some(entries) = table.get(kind).and_then(Item::as_table_like) {
            for (key, item) in entries.iter() {
                out.push(Dep { package: package_of(key, item, workspace), table: format!("{prefix}{kind}") });
            }
        }
    }
}

/// `[workspace.dependencies]` of the root manifest: key -> package name.
fn workspace_packages(root: &Path) -> Result<BTreeMap<String, String>, String> {
    let doc = read(&root.join("Cargo.toml"))?;
    let mut out = BTreeMap::new();
    if let Some(entries) = doc.get("workspace").and_then(|w| w.get("dependencies")).and_then(Item::as_table_like) {
        for (key, item) in entries.iter() {
            out.insert(key.to_string(), package_of(key, item, &BTreeMap::new()));
        }
    }
    Ok(out)
}

/// Every `crates/*/Cargo.toml` under `root`, sorted by folder.
pub fn read_manifests(root: &Path) -> Result<Vec<Manifest>, String> {
    let workspace = workspace_packages(root)?;
    let crates = root.join("crates");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&crates)
        .map_err(|e| format!("{}: {e}", crates.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|dir| dir.join("Cargo.toml").is_file())
        .collect();
    dirs.sort();
    let mut out = Vec::new();
    for dir in dirs {
        let path = dir.join("Cargo.toml");
        let doc = read(&path)?;
        let package = doc
            .get("package")
            .and_then(|p| p.get("name"))
            .and_then(Item::as_str)
            .ok_or_else(|| format!("{}: no [package] name", path.display()))?
            .to_string();
        let mut deps = Vec::new();
        deps_in(doc.as_item(), "", &workspace, &mut deps);
        if let Some(targets) = doc.get("target").and_then(Item::as_table_like) {
            for (cfg, table) in targets.iter() {
                deps_in(table, &format!("target.'{cfg}'."), &workspace, &mut deps);
            }
        }
        let lib_path = doc.get("lib").and_then(|l| l.get("path")).and_then(Item::as_str).map(String::from);
        let bin_paths = doc
            .get("bin")
            .and_then(Item::as_array_of_tables)
            .map(|bins| bins.iter().filter_map(|b| b.get("path").and_then(Item::as_str).map(String::from)).collect())
            .unwrap_or_default();
        let dir = dir.strip_prefix(root).unwrap_or(&dir).to_path_buf();
        out.push(Manifest { package, dir, deps, lib_path, bin_paths });
    }
    Ok(out)
}

/// Each crate missing from the table, and each dependency on a workspace
/// crate that is not in a strictly lower layer.
pub fn check(config: &Config, manifests: &[Manifest]) -> Vec<String> {
    let mut out = Vec::new();
    for m in manifests {
        let manifest = m.dir.join("Cargo.toml").display().to_string();
        let Some(layer) = config.layer_of(&m.package) else {
            out.push(format!("{manifest}: {} is in no layer of crates/layers/layers.toml", m.package));
            continue;
        };
        for dep in &m.deps {
            if !manifests.iter().any(|other| other.package == dep.package) {
                continue;
            }
            match config.layer_of(&dep.package) {
                // Reported once, for that crate itself.
                None => {}
                Some(below) if below < layer => {}
                Some(other) => out.push(format!(
                    "{manifest}: {} (layer {}) depends on {} (layer {}) in [{}]: a crate may depend only on crates in a lower layer",
                    m.package,
                    layer + 1,
                    dep.package,
                    other + 1,
                    dep.table
                )),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{check, read_manifests};
    use crate::config::parse;

    fn write(dir: &std::path::Path, files: &[(&str, &str)]) {
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    const LAYERS: &str = "[[layer]]\ncrates = [\"w-proto\"]\n[[layer]]\ncrates = [\"w-store\", \"w-not-yet\"]\n[[layer]]\ncrates = [\"w-server\"]\n";

    fn workspace(dir: &std::path::Path, store_deps: &str) {
        write(
            dir,
            &[
                ("Cargo.toml", "[workspace]\nmembers = []\n[workspace.dependencies]\nw-proto = { path = \"crates/proto\" }\nproto-alias = { path = \"crates/proto\", package = \"w-proto\" }\nserde = \"1\"\n"),
                ("crates/proto/Cargo.toml", "[package]\nname = \"w-proto\"\n[dependencies]\nserde.workspace = true\n"),
                ("crates/server/Cargo.toml", "[package]\nname = \"w-server\"\n[[bin]]\nname = \"s\"\npath = \"src/s.rs\"\n[dependencies]\nw-store = { path = \"../store\" }\nproto-alias.workspace = true\n"),
                ("crates/store/Cargo.toml", &format!("[package]\nname = \"w-store\"\n{store_deps}")),
            ],
        );
    }

    #[test]
    fn a_clean_tree_passes() {
        let dir = tempfile::tempdir().unwrap();
        workspace(dir.path(), "[dependencies]\nw-proto.workspace = true\n");
        let manifests = read_manifests(dir.path()).unwrap();
        assert_eq!(manifests.iter().map(|m| m.package.as_str()).collect::<Vec<_>>(), ["w-proto", "w-server", "w-store"]);
        assert_eq!(manifests[1].deps.iter().map(|d| d.package.as_str()).collect::<Vec<_>>(), ["w-store", "w-proto"]);
        assert_eq!(manifests[1].bin_paths, ["src/s.rs"]);
        assert_eq!(check(&parse(LAYERS).unwrap(), &manifests), Vec::<String>::new());
    }

    #[test]
    fn upward_and_sideways_dependencies_fail_in_every_table() {
        let dir = tempfile::tempdir().unwrap();
        workspace(
            dir.path(),
            "[dev-dependencies]\nw-server = { path = \"../server\" }\n[target.'cfg(unix)'.build-dependencies]\nup = { path = \"../server\", package = \"w-server\" }\n",
        );
        let mut config = parse(LAYERS).unwrap();
        let found = check(&config, &read_manifests(dir.path()).unwrap());
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("w-store (layer 2) depends on w-server (layer 3) in [dev-dependencies]"), "{}", found[0]);
        assert!(found[1].contains("in [target.'cfg(unix)'.build-dependencies]"), "{}", found[1]);
        // Within one layer is not lower either.
        config.layers[1].push("w-server".into());
        config.layers.pop();
        let found = check(&config, &read_manifests(dir.path()).unwrap());
        assert!(found.iter().any(|f| f.contains("w-server (layer 2) depends on w-store (layer 2)")), "{found:?}");
    }

    #[test]
    fn a_crate_in_no_layer_fails() {
        let dir = tempfile::tempdir().unwrap();
        workspace(dir.path(), "");
        write(dir.path(), &[("crates/extra/Cargo.toml", "[package]\nname = \"w-extra\"\n")]);
        let found = check(&parse(LAYERS).unwrap(), &read_manifests(dir.path()).unwrap());
        assert_eq!(found, ["crates/extra/Cargo.toml: w-extra is in no layer of crates/layers/layers.toml"]);
    }
}
