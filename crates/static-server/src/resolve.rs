//! Turns a request target into a file under the site root, or says why it
//! cannot. This is the only place that decides which bytes on disk a client
//! may read: the target is percent-decoded, split into segments, refused if
//! it tries to climb with `..`, and the final path is canonicalized (which
//! resolves symlinks) and must still lie under the canonical root.

use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Served for `/`, for directories, and as the single-page-app fallback.
pub const INDEX: &str = "index.html";

/// Why a request target does not name a servable file.
#[derive(Debug, PartialEq, Eq)]
pub enum ResolveError {
    /// The target is not an origin-form path or its percent-encoding is
    /// broken (answered 400).
    BadTarget(String),
    /// Nothing servable is there, or the path would leave the root; both
    /// answer 404 so a client cannot probe what exists outside the site.
    NotFound,
}

impl fmt::Display for ResolveError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResolveError::BadTarget(why) => write!(formatter, "bad request target: {why}"),
            ResolveError::NotFound => formatter.write_str("not found"),
        }
    }
}

impl std::error::Error for ResolveError {}

/// The directory being served and how misses are answered.
#[derive(Debug, Clone)]
pub struct Site {
    /// Canonical (absolute, symlink-free) root, so prefix checks are exact.
    root: PathBuf,
    /// Answer extension-less misses with the root `index.html`.
    spa: bool,
}

impl Site {
    /// Canonicalizes `root`, which must be an existing directory.
    pub fn new(root: &Path, spa: bool) -> io::Result<Site> {
        let root = fs::canonicalize(root)?;
        if !root.is_dir() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not a directory", root.display())));
        }
        Ok(Site { root, spa })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file to serve for `target` (the request-target of a GET or HEAD).
    pub fn resolve(&self, target: &str) -> Result<PathBuf, ResolveError> {
        let segments = segments(target)?;
        let candidate = segments.iter().fold(self.root.clone(), |path, segment| path.join(OsStr::from_bytes(segment)));
        if let Some(file) = self.existing_file(&candidate) {
            return Ok(file);
        }
        // Client-side routers own paths like /deep/link, which have no file
        // behind them; asset paths (with an extension) stay 404 so a broken
        // <script src> fails loudly instead of receiving HTML.
        let last_has_extension =
            segments.last().is_some_and(|last| Path::new(OsStr::from_bytes(last)).extension().is_some());
        if self.spa && !last_has_extension {
            if let Some(index) = self.existing_file(&self.root.join(INDEX)) {
                return Ok(index);
            }
        }
        Err(ResolveError::NotFound)
    }

    /// `path` canonicalized if it is a regular file inside the root, or the
    /// `index.html` of a directory inside the root.
    fn existing_file(&self, path: &Path) -> Option<PathBuf> {
        let canonical = self.inside(path)?;
        let metadata = fs::metadata(&canonical).ok()?;
        if metadata.is_dir() {
            let index = self.inside(&canonical.join(INDEX))?;
            return fs::metadata(&index).ok()?.is_file().then_some(index);
        }
        // FIFOs, sockets and devices are never content, and opening a FIFO
        // would block the connection's thread forever.
        metadata.is_file().then_some(canonical)
    }

    /// Canonicalizes `path` and keeps it only if it stays under the root;
    /// a symlink pointing outside the site is treated as missing.
    fn inside(&self, path: &Path) -> Option<PathBuf> {
        let canonical = fs::canonicalize(path).ok()?;
        canonical.starts_with(&self.root).then_some(canonical)
    }
}

/// Splits an origin-form target into decoded, non-empty path segments,
/// dropping the query and fragment, skipping `.`, and refusing `..`.
fn segments(target: &str) -> Result<Vec<Vec<u8>>, ResolveError> {
    let path = target.split(['?', '#']).next().unwrap_or_default();
    if !path.starts_with('/') {
        return Err(ResolveError::BadTarget(format!("{target:?} does not start with /")));
    }
    let mut segments = Vec::new();
    // Split before decoding so an encoded slash (%2F) stays inside its
    // segment, where the check below still catches it.
    for raw in path.split('/') {
        let segment = percent_decode(raw)?;
        if segment.contains(&0) {
            return Err(ResolveError::BadTarget("path contains a NUL byte".into()));
        }
        match segment.as_slice() {
            b"" | b"." => continue,
            // Refused outright rather than resolved: nothing a site links to
            // needs `..`, and normalizing it invites off-by-one escapes.
            b".." => return Err(ResolveError::NotFound),
            _ if segment.contains(&b'/') => return Err(ResolveError::NotFound),
            _ => segments.push(segment),
        }
    }
    Ok(segments)
}

/// Decodes `%XX` escapes; a `%` not followed by two hex digits is an error.
fn percent_decode(raw: &str) -> Result<Vec<u8>, ResolveError> {
    let bytes = raw.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let high = bytes.get(index + 1).and_then(|byte| hex_value(*byte));
            let low = bytes.get(index + 2).and_then(|byte| hex_value(*byte));
            let (Some(high), Some(low)) = (high, low) else {
                return Err(ResolveError::BadTarget(format!("broken percent-escape in {raw:?}")));
            };
            decoded.push(high << 4 | low);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    Ok(decoded)
}

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary directory removed on drop, laid out as a small site plus
    /// a sibling "secret" directory outside it.
    struct Fixture {
        base: PathBuf,
        site: PathBuf,
    }

    impl Fixture {
        fn new(name: &str) -> Fixture {
            let base = std::env::temp_dir().join(format!("cloudweb-static-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&base);
            let site = base.join("site");
            fs::create_dir_all(site.join("docs/guide")).unwrap();
            fs::create_dir_all(site.join("empty")).unwrap();
            fs::create_dir_all(base.join("secret")).unwrap();
            fs::write(site.join("index.html"), "root index").unwrap();
            fs::write(site.join("app.js"), "js").unwrap();
            fs::write(site.join("docs/index.html"), "docs index").unwrap();
            fs::write(site.join("docs/guide/page one.html"), "page one").unwrap();
            fs::write(base.join("secret/key.txt"), "secret").unwrap();
            std::os::unix::fs::symlink(base.join("secret"), site.join("escape")).unwrap();
            std::os::unix::fs::symlink(base.join("secret/key.txt"), site.join("key.txt")).unwrap();
            std::os::unix::fs::symlink(site.join("app.js"), site.join("alias.js")).unwrap();
            Fixture { base, site }
        }

        fn site(&self, spa: bool) -> Site {
            Site::new(&self.site, spa).unwrap()
        }

        /// Resolves `target` and returns the served file's contents.
        fn check(&self, spa: bool, target: &str, expected: Result<&str, ResolveError>) {
            let actual = self.site(spa).resolve(target).map(|path| fs::read_to_string(path).unwrap());
            assert_eq!(actual.as_deref().map_err(|e| e.to_string()), expected.map_err(|e| e.to_string()), "{target}");
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.base);
        }
    }

    #[test]
    fn files_and_directory_indexes() {
        let fixture = Fixture::new("files");
        fixture.check(false, "/", Ok("root index"));
        fixture.check(false, "/index.html", Ok("root index"));
        fixture.check(false, "/app.js", Ok("js"));
        fixture.check(false, "/app.js?v=3#top", Ok("js"));
        fixture.check(false, "/docs", Ok("docs index"));
        fixture.check(false, "/docs/", Ok("docs index"));
        fixture.check(false, "//docs/./", Ok("docs index"));
        fixture.check(false, "/docs/guide/page%20one.html", Ok("page one"));
        fixture.check(false, "/%61pp.js", Ok("js"));
        fixture.check(false, "/alias.js", Ok("js"));
    }

    #[test]
    fn misses_are_not_found_without_spa() {
        let fixture = Fixture::new("misses");
        fixture.check(false, "/missing.js", Err(ResolveError::NotFound));
        fixture.check(false, "/deep/link", Err(ResolveError::NotFound));
        fixture.check(false, "/empty", Err(ResolveError::NotFound));
        fixture.check(false, "/docs/guide", Err(ResolveError::NotFound));
    }

    #[test]
    fn nothing_outside_the_root() {
        let fixture = Fixture::new("outside");
        for spa in [false, true] {
            fixture.check(spa, "/../secret/key.txt", Err(ResolveError::NotFound));
            fixture.check(spa, "/docs/../../secret/key.txt", Err(ResolveError::NotFound));
            fixture.check(spa, "/%2e%2e/secret/key.txt", Err(ResolveError::NotFound));
            fixture.check(spa, "/..%2fsecret%2fkey.txt", Err(ResolveError::NotFound));
            fixture.check(spa, "/docs/..", Err(ResolveError::NotFound));
            fixture.check(spa, "/escape/key.txt", Err(ResolveError::NotFound));
            fixture.check(spa, "/key.txt", Err(ResolveError::NotFound));
        }
    }

    #[test]
    fn spa_falls_back_only_for_extensionless_paths() {
        let fixture = Fixture::new("spa");
        fixture.check(true, "/deep/link", Ok("root index"));
        fixture.check(true, "/deep/link?tab=2", Ok("root index"));
        fixture.check(true, "/empty", Ok("root index"));
        fixture.check(true, "/docs", Ok("docs index"));
        fixture.check(true, "/app.js", Ok("js"));
        fixture.check(true, "/missing.js", Err(ResolveError::NotFound));
        fixture.check(true, "/deep/missing.css", Err(ResolveError::NotFound));
    }

    #[test]
    fn spa_without_root_index_is_not_found() {
        let fixture = Fixture::new("spa-no-index");
        fs::remove_file(fixture.site.join("index.html")).unwrap();
        fixture.check(true, "/deep/link", Err(ResolveError::NotFound));
        fixture.check(true, "/", Err(ResolveError::NotFound));
    }

    #[test]
    fn malformed_targets_are_bad_requests() {
        let fixture = Fixture::new("malformed");
        let site = fixture.site(true);
        for target in ["app.js", "*", "http://example.com/app.js", "/bad%2", "/bad%zz", "/nul%00.js"] {
            assert!(matches!(site.resolve(target), Err(ResolveError::BadTarget(_))), "{target}");
        }
    }

    #[test]
    fn root_must_be_a_directory() {
        let fixture = Fixture::new("root");
        assert!(Site::new(&fixture.site.join("app.js"), false).is_err());
        assert!(Site::new(&fixture.base.join("nope"), false).is_err());
    }
}
