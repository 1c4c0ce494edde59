//! A crate target's module tree, read from its source: the files that
//! `mod name;` declarations lead to from the root file, the inline modules
//! (`mod tests { … }`) inside each, and every path that starts with
//! `crate::`, `super::` or `self::` (in `use` trees, groups included, and in
//! code), resolved to the file of the module it names.
//!
//! `#[path = …]` attributes are not followed (the workspace has none): such
//! a module's default file is usually missing, which is reported, so the check
//! fails rather than silently skip it. Paths written inside strings (as in
//! `#[serde(with = "crate::…")]`) are not seen.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::lexer::{tokenize, Tok, Token};

/// What one file says about modules.
#[derive(Debug, Default)]
pub struct Scan {
    /// `mod name;`: (inline module path inside the file, name, line).
    pub declared: Vec<(Vec<String>, String, u32)>,
    /// Every inline module, as its path inside the file.
    pub inline: Vec<Vec<String>>,
    pub refs: Vec<Ref>,
}

/// One path such as `super::key::KeyPair` (the first segment is `crate`,
/// `super` or `self`), with the inline module it was written in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ref {
    pub inline: Vec<String>,
    pub path: Vec<String>,
    pub line: u32,
}

fn ident(tokens: &[Token], i: usize) -> Option<&str> {
    match tokens.get(i).map(|t| &t.tok) {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

fn is(tokens: &[Token], i: usize, tok: &Tok) -> bool {
    tokens.get(i).map(|t| &t.tok) == Some(tok)
}

/// The paths of a `use` tree or a plain path starting at `i` below `prefix`:
/// `a::{b, c::{self, d}}` gives `a::b`, `a::c::self` and `a::c::d`, each
/// with the line of its last segment. Returns where the tree ends.
fn parse_tree(tokens: &[Token], mut i: usize, prefix: Vec<String>) -> (Vec<(Vec<String>, u32)>, usize) {
    let mut segments = prefix;
    let mut line = tokens.get(i).map_or(0, |t| t.line);
    loop {
        if let Some(name) = ident(tokens, i) {
            segments.push(name.to_string());
            line = tokens[i].line;
            i += 1;
            if is(tokens, i, &Tok::PathSep) {
                i += 1;
                continue;
            }
            if ident(tokens, i) == Some("as") {
                i += 2;
            }
            return (vec![(segments, line)], i);
        }
        if is(tokens, i, &Tok::Punct('{')) {
            i += 1;
            let mut out = Vec::new();
            loop {
                match tokens.get(i).map(|t| &t.tok) {
                    None => return (out, i),
                    Some(Tok::Punct('}')) => return (out, i + 1),
                    Some(Tok::Punct(',')) => i += 1,
                    Some(_) => {
                        let (paths, next) = parse_tree(tokens, i, segments.clone());
                        out.extend(paths);
                        i = next.max(i + 1);
                    }
                }
            }
        }
        if is(tokens, i, &Tok::Punct('*')) {
            i += 1;
        }
        // A glob, a turbofish (`::<T>`) or the end of the path.
        return (vec![(segments, line)], i);
    }
}

pub fn scan(source: &str) -> Scan {
    let tokens = tokenize(source);
    let mut out = Scan::default();
    let mut depth = 0usize;
    // Inline modules open here: (name, brace depth outside it).
    let mut open: Vec<(String, usize)> = Vec::new();
    let current = |open: &[(String, usize)]| open.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i].tok {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if open.last().is_some_and(|(_, d)| *d == depth) {
                    open.pop();
                }
            }
            Tok::Ident(word) if word == "mod" => {
                if let Some(name) = ident(&tokens, i + 1) {
                    if is(&tokens, i + 2, &Tok::Punct(';')) {
                        out.declared.push((current(&open), name.to_string(), tokens[i].line));
                    } else if is(&tokens, i + 2, &Tok::Punct('{')) {
                        open.push((name.to_string(), depth));
                        out.inline.push(current(&open));
                    }
                    // The `;` or `{` is handled on the next turn.
                    i += 2;
                    continue;
                }
            }
            Tok::Ident(word)
                if matches!(word.as_str(), "crate" | "super" | "self")
                    && is(&tokens, i + 1, &Tok::PathSep)
                    // `$crate::` in a macro, or a segment in the middle of a path.
                    && !(i > 0 && (is(&tokens, i - 1, &Tok::Punct('$')) || is(&tokens, i - 1, &Tok::PathSep))) =>
            {
                let (paths, next) = parse_tree(&tokens, i, Vec::new());
                let inline = current(&open);
                out.refs.extend(paths.into_iter().map(|(path, line)| Ref { inline: inline.clone(), path, line }));
                i = next;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The absolute module path that `path`, written in module `current`, names
/// (items included: `crate::a::Item` gives `[a, Item]`); `None` for a
/// `super` above the crate root.
pub fn absolute(current: &[String], path: &[String]) -> Option<Vec<String>> {
    let (first, rest) = path.split_first()?;
    let mut out = match first.as_str() {
        "crate" => Vec::new(),
        "self" => current.to_vec(),
        "super" => current.split_last()?.1.to_vec(),
        _ => return None,
    };
    for segment in rest {
        match segment.as_str() {
            "super" => {
                out.pop()?;
            }
            "self" => {}
            s => out.push(s.to_string()),
        }
    }
    Some(out)
}

/// One source file of a target and its module path.
#[derive(Debug)]
pub struct File {
    pub module: Vec<String>,
    pub path: PathBuf,
    pub scan: Scan,
}

#[derive(Debug, Default)]
pub struct Tree {
    pub files: Vec<File>,
    /// Every module path, inline ones included, and the file it is in.
    pub modules: BTreeMap<Vec<String>, usize>,
    /// Declarations whose file was not found, and unreadable files.
    pub problems: Vec<String>,
}

impl Tree {
    /// The file holding the innermost module that `path` is in.
    pub fn file_of(&self, path: &[String]) -> usize {
        (0..=path.len()).rev().find_map(|n| self.modules.get(&path[..n]).copied()).unwrap_or(0)
    }
}

/// The module tree reached from a target's root file (`src/lib.rs`,
/// `src/main.rs`, …).
pub fn load(root: &Path) -> Tree {
    let mut tree = Tree::default();
    let mut pending = vec![(Vec::new(), root.to_path_buf(), true)];
    while let Some((module, path, dir_owner)) = pending.pop() {
        let source = match std::fs::read_to_string(&path) {
            Ok(s) => s,
            Err(e) => {
                tree.problems.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        let scan = scan(&source);
        let index = tree.files.len();
        tree.modules.insert(module.clone(), index);
        for inline in &scan.inline {
            tree.modules.insert([module.clone(), inline.clone()].concat(), index);
        }
        // Where this file's child modules live: beside a root or `mod.rs`,
        // else in the folder named after the file.
        let parent = path.parent().unwrap_or(Path::new(""));
        let base = if dir_owner { parent.to_path_buf() } else { parent.join(path.file_stem().unwrap_or_default()) };
        for (inline, name, line) in &scan.declared {
            let dir = inline.iter().fold(base.clone(), |d, m| d.join(m));
            let flat = dir.join(format!("{name}.rs"));
            let nested = dir.join(name).join("mod.rs");
            let child = [module.clone(), inline.clone(), vec![name.clone()]].concat();
            if flat.is_file() {
                pending.push((child, flat, false));
            } else if nested.is_file() {
                pending.push((child, nested, true));
            } else {
                tree.problems.push(format!("{}:{line}: `mod {name};`: neither {} nor {} exists", path.display(), flat.display(), nested.display()));
            }
        }
        tree.files.push(File { module, path, scan });
    }
    tree
}

#[cfg(test)]
mod tests {
    use super::{absolute, scan};

    fn v(path: &str) -> Vec<String> {
        path.split("::").filter(|s| !s.is_empty()).map(String::from).collect()
    }

    #[test]
    fn finds_paths_in_use_trees_and_code() {
        let found = scan(
            "use crate::{a::X, b::{self, c::Y as Z}};\n\
             use super::*;\n\
             fn f() { self::g(); let t = crate::d::e::<u8>(); $crate::m::n; other::crate_like; }\n\
             pub(crate) fn h() {}\n",
        );
        let paths: Vec<(String, u32)> = found.refs.iter().map(|r| (r.path.join("::"), r.line)).collect();
        let expected = [("crate::a::X", 1), ("crate::b::self", 1), ("crate::b::c::Y", 1), ("super", 2), ("self::g", 3), ("crate::d::e", 3)];
        assert_eq!(paths, expected.map(|(p, l)| (p.to_string(), l)));
    }

    #[test]
    fn tracks_inline_modules_and_declarations() {
        let found = scan(
            "mod a;\n\
             #[cfg(test)]\n\
             mod tests {\n    fn f() { if x { super::y(); } }\n    mod deeper;\n}\n\
             fn after() { super::z(); }\n",
        );
        assert_eq!(found.declared, [(vec![], "a".to_string(), 1), (v("tests"), "deeper".to_string(), 5)]);
        assert_eq!(found.inline, [v("tests")]);
        let inlines: Vec<(Vec<String>, String)> = found.refs.iter().map(|r| (r.inline.clone(), r.path.join("::"))).collect();
        assert_eq!(inlines, [(v("tests"), "super::y".to_string()), (vec![], "super::z".to_string())]);
    }

    #[test]
    fn resolves_relative_paths() {
        assert_eq!(absolute(&v("mesh::key"), &v("super::status::X")), Some(v("mesh::status::X")));
        assert_eq!(absolute(&v("mesh::key::tests"), &v("super::super::device")), Some(v("mesh::device")));
        assert_eq!(absolute(&v("mesh"), &v("self::key")), Some(v("mesh::key")));
        assert_eq!(absolute(&v("a::b"), &v("crate::c::self")), Some(v("c")));
        assert_eq!(absolute(&[], &v("super::x")), None);
    }
}
