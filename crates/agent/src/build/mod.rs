//! Turning a checkout into an image: pick the strategy (Dockerfile, static
//! site, buildpacks), run it, and check everything the control plane sent
//! again before using it.

pub mod firewall;
pub mod git;
pub mod mirror;
pub mod pins;
pub mod static_site;

use std::path::{Path, PathBuf};

use cloudweb_protocol::{BuildSettings, Spa, Strategy};

pub use static_site::{build_static_site, StaticPlan};

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Failed(String),
    #[error("i/o error on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// What the agent decided to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    Dockerfile,
    Static(StaticPlan),
    Buildpacks,
}

/// Chooses the build for a checkout. An explicit strategy wins; `auto`
/// takes a root Dockerfile, else a static site (explicit settings, a
/// package.json with a build script, or a plain index.html), else
/// buildpacks.
pub fn plan(checkout: &Path, strategy: Strategy, settings: Option<&BuildSettings>) -> Result<Plan, BuildError> {
    let dockerfile = checkout.join("Dockerfile");
    let has_dockerfile = std::fs::symlink_metadata(&dockerfile).map(|m| m.is_file()).unwrap_or(false);
    let uses_dockerfile = strategy == Strategy::Dockerfile || (strategy == Strategy::Auto && settings.is_none());
    if has_dockerfile && uses_dockerfile {
        let text = std::fs::read_to_string(&dockerfile).map_err(|source| BuildError::Io { path: dockerfile.clone(), source })?;
        if let Some(instruction) = remote_add(&text) {
            return Err(remote_add_refused(&instruction));
        }
    }
    match strategy {
        Strategy::Dockerfile if has_dockerfile => Ok(Plan::Dockerfile),
        Strategy::Dockerfile => Err(BuildError::Invalid("strategy is dockerfile but the repository has no Dockerfile at its root".into())),
        Strategy::Static => Ok(Plan::Static(static_site::plan(checkout, settings)?)),
        Strategy::Buildpacks => Ok(Plan::Buildpacks),
        Strategy::Auto if has_dockerfile && settings.is_none() => Ok(Plan::Dockerfile),
        Strategy::Auto => match static_site::detect(checkout, settings)? {
            Some(plan) => Ok(Plan::Static(plan)),
            None => Ok(Plan::Buildpacks),
        },
    }
}

/// The plan for a commit whose files are only an archive so far (see
/// `mirror`): `Some(Plan::Dockerfile)` when [`plan`] would choose the root
/// Dockerfile, with the same checks; `None` when the choice needs the files
/// on disk (static sites, buildpacks).
pub fn plan_from_archive(archive: &[u8], strategy: Strategy, settings: Option<&BuildSettings>) -> Result<Option<Plan>, BuildError> {
    let uses_dockerfile = strategy == Strategy::Dockerfile || (strategy == Strategy::Auto && settings.is_none());
    if !uses_dockerfile {
        return Ok(None);
    }
    let unreadable = |e: std::io::Error| BuildError::Failed(format!("cannot read the commit's archive: {e}"));
    let mut dockerfile = None;
    for entry in tar::Archive::new(archive).entries().map_err(unreadable)? {
        let mut entry = entry.map_err(unreadable)?;
        // A regular file, as `plan` asks (a symlink named Dockerfile is not one).
        let is_file = matches!(entry.header().entry_type(), tar::EntryType::Regular | tar::EntryType::Continuous);
        if is_file && entry.path().map_err(unreadable)?.as_os_str() == "Dockerfile" {
            let mut text = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut text).map_err(unreadable)?;
            dockerfile = Some(String::from_utf8(text).map_err(|_| BuildError::Invalid("the Dockerfile is not UTF-8 text".into()))?);
            break;
        }
    }
    match dockerfile {
        Some(text) => {
            if let Some(instruction) = remote_add(&text) {
                return Err(remote_add_refused(&instruction));
            }
            Ok(Some(Plan::Dockerfile))
        }
        None if strategy == Strategy::Dockerfile => Err(BuildError::Invalid("strategy is dockerfile but the repository has no Dockerfile at its root".into())),
        None => Ok(None),
    }
}

fn remote_add_refused(instruction: &str) -> BuildError {
    if instruction.contains('$') {
        return BuildError::Invalid(format!(
            "the Dockerfile's ADD takes its source from a variable ({instruction}); a URL in it would be fetched by the Docker daemon \
             from the node's own network, and its value is only known during the build, so ADD sources must be written out: \
             use COPY for the repository's files, or download in a RUN step"
        ));
    }
    BuildError::Invalid(format!(
        "the Dockerfile fetches a URL with ADD ({instruction}); the Docker daemon would fetch it from the node's own network, \
         so download it in a RUN step instead"
    ))
}

/// The first `ADD` (or `ONBUILD ADD`) of a Dockerfile whose source is a
/// URL or a git remote, or holds a variable, shortened for the message.
/// The Docker daemon fetches URLs itself, from the host's network
/// namespace, where the build network does not apply and loopback is the
/// node's own: such an `ADD` could read the node's private services into
/// the image. A variable (`$U`, `${U}`, `${U:-http://…}`) could hold a URL
/// from an `ARG` default, an `ENV`, or the base image's environment, which
/// only the build knows, so no expansion here could be complete: any `$`
/// in a source is refused (`COPY` takes variables; it never fetches).
///
/// The Dockerfile is split into instructions the way Docker does it (see
/// [`instructions`]). Heredocs (`ADD <<EOF …`) are not parsed: their body
/// is file content, not a source, so an `ADD` heredoc cannot fetch a URL.
pub fn remote_add(dockerfile: &str) -> Option<String> {
    for instruction in instructions(dockerfile) {
        let mut words = instruction.split_whitespace();
        let mut keyword = words.next().unwrap_or_default();
        if keyword.eq_ignore_ascii_case("ONBUILD") {
            keyword = words.next().unwrap_or_default();
        }
        if !keyword.eq_ignore_ascii_case("ADD") {
            continue;
        }
        let rest: Vec<&str> = words.filter(|w| !w.starts_with("--")).collect();
        let joined = rest.join(" ");
        // The JSON form, `ADD ["src", "dest"]`, or plain words.
        let sources: Vec<String> = match serde_json::from_str::<Vec<String>>(&joined) {
            Ok(mut list) => {
                list.pop();
                list
            }
            Err(_) => rest[..rest.len().saturating_sub(1)].iter().map(|s| s.to_string()).collect(),
        };
        let remote = sources.iter().any(|source| source.contains("://") || source.contains('$') || source.to_ascii_lowercase().starts_with("git@"));
        if remote {
            let mut shown: String = instruction.chars().take(120).collect();
            if shown.len() < instruction.len() {
                shown.push('…');
            }
            return Some(shown);
        }
    }
    None
}

/// Splits a Dockerfile into instructions by Docker's rules: parser
/// directives (`# escape=…`, `# syntax=…`, `# check=…`) are read only
/// before the first comment, empty line or instruction, and `escape`
/// chooses the line continuation character (`\` or a backtick); comment
/// lines and empty lines are dropped, also in the middle of a
/// continuation; a line ending in the escape character (trailing blanks
/// allowed) continues on the next one.
fn instructions(dockerfile: &str) -> Vec<String> {
    let mut escape = '\\';
    let mut lines = dockerfile.lines().peekable();
    while let Some(line) = lines.peek() {
        let Some((name, value)) = parser_directive(line) else { break };
        if name == "escape" && (value == "`" || value == "\\") {
            escape = value.chars().next().unwrap_or('\\');
        }
        lines.next();
    }
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in lines {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        match trimmed.strip_suffix(escape) {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                instructions.push(std::mem::take(&mut current));
            }
        }
    }
    if !current.trim().is_empty() {
        instructions.push(current);
    }
    instructions
}

/// `# name=value` with a known directive name (case-insensitive); any
/// other line ends the directives.
fn parser_directive(line: &str) -> Option<(String, String)> {
    let body = line.trim().strip_prefix('#')?;
    let (name, value) = body.split_once('=')?;
    let name = name.trim().to_ascii_lowercase();
    if !["escape", "syntax", "check"].contains(&name.as_str()) {
        return None;
    }
    Some((name, value.trim().to_string()))
}

/// Resolves `relative` inside `root`, following symlinks, and refuses
/// anything that ends up outside it.
pub fn inside(root: &Path, relative: &str) -> Result<PathBuf, BuildError> {
    cloudweb_protocol::deploy::output_dir(relative).map_err(|e| BuildError::Invalid(e.to_string()))?;
    let root = root.canonicalize().map_err(|source| BuildError::Io { path: root.to_path_buf(), source })?;
    let candidate = root.join(relative);
    let resolved = candidate
        .canonicalize()
        .map_err(|_| BuildError::Invalid(format!("output_dir {relative} does not exist after the build")))?;
    if !resolved.starts_with(&root) {
        return Err(BuildError::Invalid(format!("output_dir {relative} resolves outside the project")));
    }
    if !resolved.is_dir() {
        return Err(BuildError::Invalid(format!("output_dir {relative} is not a directory")));
    }
    Ok(resolved)
}

/// A tar archive of `dir` (without `.git`) for a Docker build context.
/// Symlinks are archived as links, never followed, so nothing outside the
/// directory gets in.
pub fn context_archive(dir: &Path, prefix: &str, extra: &[(&str, &[u8])]) -> Result<Vec<u8>, BuildError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BuildError::Io { path, source }
    };
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    add_dir(&mut builder, dir, Path::new(prefix))?;
    for (name, bytes) in extra {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, *bytes).map_err(io(dir))?;
    }
    builder.into_inner().map_err(io(dir))
}

fn add_dir(builder: &mut tar::Builder<Vec<u8>>, dir: &Path, prefix: &Path) -> Result<(), BuildError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BuildError::Io { path, source }
    };
    let mut entries: Vec<_> = std::fs::read_dir(dir).map_err(io(dir))?.collect::<Result<_, _>>().map_err(io(dir))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name();
        if name == ".git" {
            continue;
        }
        let path = entry.path();
        let archived = prefix.join(&name);
        let kind = entry.file_type().map_err(io(&path))?;
        if kind.is_dir() {
            builder.append_dir(&archived, &path).map_err(io(&path))?;
            add_dir(builder, &path, &archived)?;
        } else {
            // Files and symlinks (as links) alike.
            builder.append_path_with_name(&path, &archived).map_err(io(&path))?;
        }
    }
    Ok(())
}

/// Whether SPA fallback is on for a plan's `spa` setting.
pub fn spa_enabled(spa: Spa, has_package_json: bool) -> bool {
    match spa {
        Spa::Yes => true,
        Spa::No => false,
        // Framework builds (a package.json) are usually single-page apps;
        // plain HTML sites are not.
        Spa::Auto => has_package_json,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_from_a_url_is_refused() {
        for bad in [
            "FROM x\nADD http://127.0.0.1:8080/secret /s\n",
            "FROM x\nadd --chown=1:1 https://169.254.169.254/latest/meta-data /m\n",
            "FROM x\nADD [\"http://10.0.0.1/a\", \"/a\"]\n",
            "FROM x\nADD \\\n  http://localhost/a \\\n  /a\n",
            "FROM x\nONBUILD ADD git@github.com:a/b.git /b\n",
            "FROM x\nADD --keep-git-dir=true https://github.com/a/b.git /b\n",
            // Issue 20 item 2: the URL in a variable.
            "FROM x\nARG U=http://127.0.0.1:29999/x\nADD $U /x\n",
            "FROM x\nENV U=http://127.0.0.1:29999/x\nADD ${U} /x\n",
            "FROM x\nADD ${U:-http://127.0.0.1:29999/x} /x\n",
            "FROM x\nARG U\nADD [\"$U\", \"/x\"]\n",
            "FROM x\nADD --chmod=644 local $U /dir/\n",
            "# escape=`\nFROM x\nARG U=http://127.0.0.1/x\nADD `\n  $U /x\n",
            "FROM x\nONBUILD ADD $U /x\n",
        ] {
            assert!(remote_add(bad).is_some(), "{bad}");
        }
        for good in [
            "FROM x\nADD site.tar.gz /srv/\nCOPY . /app\n",
            "FROM x\n# ADD http://x/y /z\nRUN echo http://x\n",
            "FROM x\nCOPY http /x\n",
            "FROM x\nARG D=/srv\nADD site.tar.gz $D/\nCOPY $D /app\n",
        ] {
            assert_eq!(remote_add(good), None, "{good}");
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Dockerfile"), "FROM x\nADD http://127.0.0.1:9/x /x\n").unwrap();
        let err = plan(dir.path(), Strategy::Auto, None).unwrap_err().to_string();
        assert!(err.contains("RUN step"), "{err}");
        std::fs::write(dir.path().join("Dockerfile"), "FROM x\nARG U=http://127.0.0.1:9/x\nADD $U /x\n").unwrap();
        let err = plan(dir.path(), Strategy::Auto, None).unwrap_err().to_string();
        assert!(err.contains("from a variable") && err.contains("COPY"), "{err}");
    }

    #[test]
    fn remote_add_follows_dockerfile_line_rules() {
        // (Dockerfile, refused?)
        let cases: &[(&str, bool)] = &[
            // A comment line inside a continuation is dropped by Docker.
            ("FROM x\nADD \\\n# a comment\n  http://127.0.0.1/a \\\n  /a\n", true),
            ("FROM x\nADD \\\n    # indented comment\n  http://127.0.0.1/a /a\n", true),
            // So is an empty line.
            ("FROM x\nADD \\\n\n  http://127.0.0.1/a /a\n", true),
            ("FROM x\nADD \\\n   \t\n  http://127.0.0.1/a /a\n", true),
            // Trailing blanks after the escape still continue the line.
            ("FROM x\nADD \\   \n  http://127.0.0.1/a /a\n", true),
            // A backtick escape: the backtick continues the line…
            ("# escape=`\nFROM x\nADD `\n  http://127.0.0.1/a /a\n", true),
            ("#escape = `\n# syntax=docker/dockerfile:1\nFROM x\nADD `\n# c\n\n  https://10.0.0.1/a C:\\a\n", true),
            ("# syntax=docker/dockerfile:1\n# ESCAPE=`\nFROM x\nADD `\n  git@github.com:a/b.git /b\n", true),
            // …and a backslash no longer hides the next instruction in a RUN.
            ("# escape=`\nFROM x\nRUN echo C:\\\nADD http://127.0.0.1/a /a\n", true),
            // Case and flags do not matter.
            ("FROM x\nAdD --chmod=644 --checksum=sha256:0 HTTP://127.0.0.1/a /a\n", true),
            ("FROM x\nadd --link Git@example.com:a/b.git /b\n", true),
            ("FROM x\nONBUILD add --chown=1 \\\n# c\n http://x/y /y\n", true),
            // Any source, not only the first.
            ("FROM x\nADD local.txt \\\n\n http://127.0.0.1/b /dst/\n", true),
            ("FROM x\nADD [\"local\", \"ftp://h/a\", \"/dst/\"]\n", true),
            // Not remote.
            ("FROM x\nADD site.tar.gz /srv/\n", false),
            ("FROM x\nADD \\\n# http://127.0.0.1/a\n  local /a\n", false),
            ("FROM x\nCOPY http://127.0.0.1/a /a\n", false),
            // A directive after the first comment is a plain comment, so
            // the backslash still continues here and the URL is a RUN word.
            ("# hello\n# escape=`\nFROM x\nRUN echo \\\n  http://127.0.0.1/a\n", false),
            // The destination is not fetched.
            ("FROM x\nADD a.txt http://not-a-source\n", false),
        ];
        for (dockerfile, refused) in cases {
            assert_eq!(remote_add(dockerfile).is_some(), *refused, "{dockerfile:?}");
        }
    }

    #[test]
    fn output_dir_cannot_escape_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("dist")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("out")).unwrap();
        assert!(inside(dir.path(), "dist").is_ok());
        let err = inside(dir.path(), "out").unwrap_err().to_string();
        assert!(err.contains("outside the project"), "{err}");
        assert!(inside(dir.path(), "../etc").is_err());
        assert!(inside(dir.path(), "/etc").is_err());
        assert!(inside(dir.path(), "missing").is_err());
    }

    #[test]
    fn strategies() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(plan(dir.path(), Strategy::Auto, None).unwrap(), Plan::Buildpacks);
        std::fs::write(dir.path().join("index.html"), "<h1>hi</h1>").unwrap();
        assert!(matches!(plan(dir.path(), Strategy::Auto, None).unwrap(), Plan::Static(_)));
        std::fs::write(dir.path().join("Dockerfile"), "FROM scratch").unwrap();
        assert_eq!(plan(dir.path(), Strategy::Auto, None).unwrap(), Plan::Dockerfile);
        assert!(matches!(plan(dir.path(), Strategy::Static, None).unwrap(), Plan::Static(_)));
        let empty = tempfile::tempdir().unwrap();
        assert!(plan(empty.path(), Strategy::Dockerfile, None).is_err());
    }

    /// A tar archive of `files` (name, content; `None`: a symlink to /etc/passwd).
    fn tar_of(files: &[(&str, Option<&str>)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, content) in files {
            let mut header = tar::Header::new_gnu();
            match content {
                Some(text) => {
                    header.set_size(text.len() as u64);
                    header.set_mode(0o644);
                    header.set_cksum();
                    builder.append_data(&mut header, name, text.as_bytes()).unwrap();
                }
                None => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_size(0);
                    builder.append_link(&mut header, name, "/etc/passwd").unwrap();
                }
            }
        }
        builder.into_inner().unwrap()
    }

    #[test]
    fn an_archive_plans_a_dockerfile_build_like_a_checkout() {
        let dockerfile = tar_of(&[("index.html", Some("hi")), ("Dockerfile", Some("FROM scratch\n"))]);
        assert_eq!(plan_from_archive(&dockerfile, Strategy::Auto, None).unwrap(), Some(Plan::Dockerfile));
        assert_eq!(plan_from_archive(&dockerfile, Strategy::Dockerfile, None).unwrap(), Some(Plan::Dockerfile));
        // Other strategies, or build settings, need the files on disk.
        assert_eq!(plan_from_archive(&dockerfile, Strategy::Static, None).unwrap(), None);
        let settings = BuildSettings::default();
        assert_eq!(plan_from_archive(&dockerfile, Strategy::Auto, Some(&settings)).unwrap(), None);
        // No root Dockerfile (one in a subdirectory or a symlink does not count).
        let none = tar_of(&[("index.html", Some("hi")), ("sub/Dockerfile", Some("FROM scratch\n")), ("Dockerfile", None)]);
        assert_eq!(plan_from_archive(&none, Strategy::Auto, None).unwrap(), None);
        assert!(plan_from_archive(&none, Strategy::Dockerfile, None).unwrap_err().to_string().contains("no Dockerfile"));
        // The same refusal of a remote ADD as for a checkout.
        let remote = tar_of(&[("Dockerfile", Some("FROM x\nADD http://127.0.0.1:9/x /x\n"))]);
        assert!(plan_from_archive(&remote, Strategy::Auto, None).unwrap_err().to_string().contains("RUN step"));
    }

    #[test]
    fn archives_skip_git_and_keep_links_as_links() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(".git")).unwrap();
        std::fs::write(dir.path().join(".git/config"), "secret").unwrap();
        std::fs::write(dir.path().join("a.txt"), "a").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("link")).unwrap();
        let archive = context_archive(dir.path(), "", &[("Dockerfile", b"FROM scratch")]).unwrap();
        let mut names = Vec::new();
        for entry in tar::Archive::new(archive.as_slice()).entries().unwrap() {
            let entry = entry.unwrap();
            names.push((entry.path().unwrap().display().to_string(), entry.header().entry_type().is_symlink()));
        }
        assert!(names.contains(&("a.txt".to_string(), false)));
        assert!(names.contains(&("link".to_string(), true)));
        assert!(names.contains(&("Dockerfile".to_string(), false)));
        assert!(!names.iter().any(|(n, _)| n.contains(".git")));
    }
}
