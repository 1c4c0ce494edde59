//! Import circles inside one crate target. A path written in module `m`
//! that names something in module `t` is an edge between the two children
//! of their deepest common ancestor that hold them: at the top level
//! between top-level modules (`identity` -> `mesh` for a path in
//! `identity.rs` into `mesh/key.rs`), and inside a directory module between
//! its files. A module's use of its own parent or children is no edge
//! (`mod.rs` and the files below it belong together). A circle is a
//! strongly connected component of more than one module.

use std::collections::BTreeMap;
use std::path::Path;

use crate::modules::{absolute, Tree};

/// Where one edge was seen: the first path that makes it, and how many.
#[derive(Debug, Clone)]
pub struct Evidence {
    pub from_file: String,
    pub line: u32,
    pub path: String,
    pub to_file: String,
    pub count: usize,
}

#[derive(Debug, Clone)]
pub struct Circle {
    /// The modules in the circle, as paths from the crate root, sorted.
    pub modules: Vec<String>,
    /// The edges between them, sorted by module.
    pub edges: Vec<(String, String, Evidence)>,
}

fn shown(path: &Path, base: &Path) -> String {
    path.strip_prefix(base).unwrap_or(path).display().to_string()
}

/// A path as written, less the `self` that ends a `use` group's entry
/// (`super::backend::{self, …}` shows as `super::backend`).
fn shown_path(path: &[String]) -> String {
    let keep = path.iter().enumerate().filter(|(i, s)| *i == 0 || s.as_str() != "self");
    keep.map(|(_, s)| s.as_str()).collect::<Vec<_>>().join("::")
}

/// The circles of one target's tree; file names are shown relative to `base`.
pub fn find(tree: &Tree, base: &Path) -> Vec<Circle> {
    // (from, to) module -> evidence.
    let mut edges: BTreeMap<(Vec<String>, Vec<String>), Evidence> = BTreeMap::new();
    for file in &tree.files {
        for r in &file.scan.refs {
            let current = [file.module.clone(), r.inline.clone()].concat();
            let Some(target) = absolute(&current, &r.path) else { continue };
            let target_file = &tree.files[tree.file_of(&target)];
            let (from, to) = (&file.module, &target_file.module);
            let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
            if from.len() == common || to.len() == common {
                continue;
            }
            let key = (from[..=common].to_vec(), to[..=common].to_vec());
            edges
                .entry(key)
                .and_modify(|e| e.count += 1)
                .or_insert_with(|| Evidence { from_file: shown(&file.path, base), line: r.line, path: shown_path(&r.path), to_file: shown(&target_file.path, base), count: 1 });
        }
    }
    let mut nodes: Vec<Vec<String>> = edges.keys().flat_map(|(a, b)| [a.clone(), b.clone()]).collect();
    nodes.sort();
    nodes.dedup();
    let index = |n: &Vec<String>| nodes.binary_search(n).expect("every edge end is a node");
    let mut successors = vec![Vec::new(); nodes.len()];
    for (a, b) in edges.keys() {
        successors[index(a)].push(index(b));
    }
    let mut circles = Vec::new();
    for component in strongly_connected(&successors) {
        if component.len() < 2 {
            continue;
        }
        let members: Vec<&Vec<String>> = component.iter().map(|&i| &nodes[i]).collect();
        let mut modules: Vec<String> = members.iter().map(|m| m.join("::")).collect();
        modules.sort();
        let edges = edges
            .iter()
            .filter(|((a, b), _)| members.contains(&a) && members.contains(&b))
            .map(|((a, b), e)| (a.join("::"), b.join("::"), e.clone()))
            .collect();
        circles.push(Circle { modules, edges });
    }
    circles.sort_by(|a, b| a.modules.cmp(&b.modules));
    circles
}

/// Tarjan's algorithm: the strongly connected components of a graph given
/// as each node's successors.
pub fn strongly_connected(successors: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        successors: &'a [Vec<usize>],
        next: usize,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in &s.successors[v] {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            component.sort();
            s.out.push(component);
        }
    }
    let n = successors.len();
    let mut s = State { successors, next: 0, index: vec![None; n], low: vec![0; n], stack: Vec::new(), on_stack: vec![false; n], out: Vec::new() };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::{find, shown_path, strongly_connected};
    use crate::modules::load;

    #[test]
    fn paths_show_without_a_group_self() {
        let path = |p: &str| p.split("::").map(String::from).collect::<Vec<_>>();
        assert_eq!(shown_path(&path("super::backend::self")), "super::backend");
        assert_eq!(shown_path(&path("self::key")), "self::key");
    }

    #[test]
    fn components() {
        // 0 -> 1 -> 2 -> 0, 2 -> 3, 3 -> 4 -> 3, 5 alone.
        let graph = vec![vec![1], vec![2], vec![0, 3], vec![4], vec![3], vec![]];
        let mut found = strongly_connected(&graph);
        found.sort();
        assert_eq!(found, vec![vec![0, 1, 2], vec![3, 4], vec![5]]);
    }

    fn write(dir: &std::path::Path, files: &[(&str, &str)]) {
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    #[test]
    fn a_circle_across_levels_names_its_files() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            &[
                ("lib.rs", "pub mod identity;\npub mod mesh;\npub mod clean;\npub fn root() {}\n"),
                ("identity.rs", "use crate::mesh::key::KeyPair;\n"),
                ("mesh/mod.rs", "mod key;\nmod status;\npub use key::KeyPair;\nfn f() { status::g(); crate::root(); }\n"),
                ("mesh/key.rs", "use super::status::Status;\npub struct KeyPair;\n#[cfg(test)]\nmod tests { use super::*; }\n"),
                ("mesh/status.rs", "use super::super::identity::Id;\nuse super::f;\n"),
                ("clean.rs", "use crate::identity;\n// crate::mesh in a comment\nconst S: &str = \"crate::mesh\";\n"),
            ],
        );
        let tree = load(&dir.path().join("lib.rs"));
        assert!(tree.problems.is_empty(), "{:?}", tree.problems);
        let circles = find(&tree, dir.path());
        assert_eq!(circles.len(), 1, "{circles:?}");
        assert_eq!(circles[0].modules, ["identity", "mesh"]);
        let edges: Vec<String> = circles[0].edges.iter().map(|(a, b, e)| format!("{a}->{b} {}:{} {} {}", e.from_file, e.line, e.path, e.to_file)).collect();
        assert_eq!(edges, ["identity->mesh identity.rs:1 crate::mesh::key::KeyPair mesh/key.rs", "mesh->identity mesh/status.rs:1 super::super::identity::Id identity.rs"]);
    }

    #[test]
    fn siblings_in_a_directory_and_a_clean_tree() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            &[
                ("main.rs", "mod ingress;\nfn main() {}\n"),
                ("ingress/mod.rs", "mod acme;\nmod config;\nmod dns;\npub const A: u8 = 1;\n"),
                ("ingress/acme.rs", "fn f() { super::config::host(); super::dns::x(); let _ = super::A; }\n"),
                ("ingress/config.rs", "use super::{acme::PREFIX, dns};\n"),
                ("ingress/dns.rs", "pub fn x() {}\n"),
            ],
        );
        let circles = find(&load(&dir.path().join("main.rs")), dir.path());
        assert_eq!(circles.iter().map(|c| c.modules.clone()).collect::<Vec<_>>(), [["ingress::acme", "ingress::config"]]);
        // The same tree once config no longer names acme.
        write(dir.path(), &[("ingress/config.rs", "use super::dns;\nconst P: &str = \"super::acme\";\n")]);
        assert!(find(&load(&dir.path().join("main.rs")), dir.path()).is_empty());
    }

    #[test]
    fn a_missing_module_file_is_a_problem() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &[("lib.rs", "mod gone;\n")]);
        let tree = load(&dir.path().join("lib.rs"));
        assert_eq!(tree.problems.len(), 1);
        assert!(tree.problems[0].contains("`mod gone;`"), "{:?}", tree.problems);
    }
}
