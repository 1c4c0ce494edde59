//! `crates/layers/layers.toml`: the layer table, bottom layer first, and
//! the import circles allowed for now (each with its reason).

use toml_edit::{DocumentMut, Item};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CircleException {
    pub krate: String,
    /// Module paths from the crate root, sorted.
    pub modules: Vec<String>,
    pub reason: String,
}

#[derive(Debug, Default)]
pub struct Config {
    /// Package names per layer, bottom first.
    pub layers: Vec<Vec<String>>,
    pub circle_exceptions: Vec<CircleException>,
}

impl Config {
    /// The layer a package is declared in (0 at the bottom).
    pub fn layer_of(&self, package: &str) -> Option<usize> {
        self.layers.iter().position(|layer| layer.iter().any(|c| c == package))
    }
}

fn strings(item: Option<&Item>, what: &str) -> Result<Vec<String>, String> {
    let array = item.and_then(Item::as_array).ok_or_else(|| format!("{what} must be an array of strings"))?;
    array.iter().map(|v| v.as_str().map(String::from).ok_or_else(|| format!("{what} must be an array of strings"))).collect()
}

fn only_keys(table: &toml_edit::Table, allowed: &[&str], what: &str) -> Result<(), String> {
    match table.iter().find(|(k, _)| !allowed.contains(k)) {
        Some((k, _)) => Err(format!("{what}: unknown key `{k}` (expected {})", allowed.join(", "))),
        None => Ok(()),
    }
}

pub fn parse(text: &str) -> Result<Config, String> {
    let doc: DocumentMut = text.parse().map_err(|e| format!("{e}"))?;
    only_keys(doc.as_table(), &["layer", "circle_exception"], "top level")?;
    let mut config = Config::default();
    let layers = doc.get("layer").and_then(Item::as_array_of_tables).ok_or("no [[layer]] tables")?;
    for (n, table) in layers.iter().enumerate() {
        let what = format!("[[layer]] number {}", n + 1);
        only_keys(table, &["crates"], &what)?;
        let crates = strings(table.get("crates"), &format!("{what}: crates"))?;
        if crates.is_empty() {
            return Err(format!("{what} names no crate"));
        }
        for name in &crates {
            if let Some(earlier) = config.layer_of(name).or_else(|| (crates.iter().filter(|c| *c == name).count() > 1).then_some(n)) {
                return Err(format!("{name} is declared twice (layers {} and {})", earlier + 1, n + 1));
            }
        }
        config.layers.push(crates);
    }
    if let Some(item) = doc.get("circle_exception") {
        let tables = item.as_array_of_tables().ok_or("circle_exception must be [[circle_exception]] tables")?;
        for (n, table) in tables.iter().enumerate() {
            let what = format!("[[circle_exception]] number {}", n + 1);
            only_keys(table, &["crate", "modules", "reason"], &what)?;
            let krate = table.get("crate").and_then(Item::as_str).ok_or(format!("{what}: crate must be a string"))?.to_string();
            let mut modules = strings(table.get("modules"), &format!("{what}: modules"))?;
            modules.sort();
            let reason = table.get("reason").and_then(Item::as_str).unwrap_or_default().trim().to_string();
            if modules.len() < 2 || reason.is_empty() {
                return Err(format!("{what}: needs at least two modules and a reason"));
            }
            config.circle_exceptions.push(CircleException { krate, modules, reason });
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn layers_bottom_up_and_exceptions() {
        let config = parse(
            "# bottom\n[[layer]]\ncrates = [\"a\", \"b\"]\n[[layer]]\ncrates = [\"c\"]\n\
             [[circle_exception]]\ncrate = \"c\"\nmodules = [\"y\", \"x\"]\nreason = \"until the split\"\n",
        )
        .unwrap();
        assert_eq!(config.layer_of("b"), Some(0));
        assert_eq!(config.layer_of("c"), Some(1));
        assert_eq!(config.layer_of("d"), None);
        assert_eq!(config.circle_exceptions[0].modules, ["x", "y"]);
    }

    #[test]
    fn rejects_mistakes() {
        for (text, says) in [
            ("[[layer]]\ncrates = [\"a\"]\n[[layer]]\ncrates = [\"a\"]\n", "declared twice"),
            ("[[layer]]\ncrates = [\"a\", \"a\"]\n", "declared twice"),
            ("[[layer]]\ncrates = []\n", "names no crate"),
            ("[[layer]]\ncrate = [\"a\"]\n", "unknown key `crate`"),
            ("[[layer]]\ncrates = [\"a\"]\n[[circle_exception]]\ncrate = \"a\"\nmodules = [\"x\", \"y\"]\n", "a reason"),
            ("title = 1\n", "unknown key `title`"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }
}
