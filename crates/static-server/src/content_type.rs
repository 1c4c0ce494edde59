//! Maps a file name to the `Content-Type` it is served with. The table holds
//! only what static sites ship; anything else is sent as opaque bytes so a
//! browser never guesses and runs it as a script.

use std::path::Path;

/// What a file of unknown type is sent as.
pub const DEFAULT: &str = "application/octet-stream";

/// The `Content-Type` for `path`, chosen by its extension (case-insensitive).
pub fn for_path(path: &Path) -> &'static str {
    let Some(extension) = path.extension().and_then(|extension| extension.to_str()) else {
        return DEFAULT;
    };
    match extension.to_ascii_lowercase().as_str() {
        // Text types name their charset so that non-ASCII pages without a
        // <meta charset> still render as UTF-8, which is what sites are built in.
        "html" | "htm" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "txt" => "text/plain; charset=utf-8",
        "json" | "map" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "ico" => "image/x-icon",
        // Browsers refuse WebAssembly streaming compilation under any other type.
        "wasm" => "application/wasm",
        "woff" => "font/woff",
        "woff2" => "font/woff2",
        _ => DEFAULT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &str, expected: &str) {
        assert_eq!(for_path(Path::new(name)), expected, "{name}");
    }

    #[test]
    fn known_extensions() {
        check("index.html", "text/html; charset=utf-8");
        check("style.css", "text/css; charset=utf-8");
        check("app.js", "text/javascript; charset=utf-8");
        check("module.mjs", "text/javascript; charset=utf-8");
        check("data.json", "application/json");
        check("logo.svg", "image/svg+xml");
        check("a.png", "image/png");
        check("a.jpg", "image/jpeg");
        check("a.jpeg", "image/jpeg");
        check("a.gif", "image/gif");
        check("a.webp", "image/webp");
        check("favicon.ico", "image/x-icon");
        check("robots.txt", "text/plain; charset=utf-8");
        check("app.wasm", "application/wasm");
        check("font.woff", "font/woff");
        check("font.woff2", "font/woff2");
        check("app.js.map", "application/json");
    }

    #[test]
    fn extension_case_is_ignored() {
        check("INDEX.HTML", "text/html; charset=utf-8");
        check("Photo.JPG", "image/jpeg");
    }

    #[test]
    fn unknown_or_missing_extension_is_octet_stream() {
        check("archive.tar.gz", DEFAULT);
        check("binary", DEFAULT);
        check(".htaccess", DEFAULT);
        check("dir/file.", DEFAULT);
    }
}
