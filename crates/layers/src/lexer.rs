//! Just enough of Rust's lexical grammar to find module paths: identifiers,
//! `::` and single punctuation characters, each with its line. Comments
//! (nested block comments included), string, byte, C and raw string
//! literals, character literals and numbers produce no token, so a path
//! written in a doc comment or a string never counts as an import.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tok {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub tok: Tok,
    pub line: u32,
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

struct Lexer {
    chars: Vec<char>,
    pos: usize,
    line: u32,
}

impl Lexer {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.pos + ahead).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.get(self.pos).copied()?;
        self.pos += 1;
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn skip_line_comment(&mut self) {
        while let Some(c) = self.peek(0) {
            if c == '\n' {
                return;
            }
            self.bump();
        }
    }

    /// After the opening `/*`; block comments nest.
    fn skip_block_comment(&mut self) {
        let mut depth = 1;
        while depth > 0 {
            match (self.bump(), self.peek(0)) {
                (None, _) => return,
                (Some('/'), Some('*')) => {
                    self.bump();
                    depth += 1;
                }
                (Some('*'), Some('/')) => {
                    self.bump();
                    depth -= 1;
                }
                _ => {}
            }
        }
    }

    /// After the opening `"`: up to and including the closing one.
    fn skip_quoted(&mut self, quote: char) {
        while let Some(c) = self.bump() {
            if c == '\\' {
                self.bump();
            } else if c == quote {
                return;
            }
        }
    }

    /// At the `#`s or the `"` of a raw string, after its `r` prefix.
    fn skip_raw_string(&mut self) {
        let mut hashes = 0;
        while self.peek(0) == Some('#') {
            self.bump();
            hashes += 1;
        }
        if self.bump() != Some('"') {
            return;
        }
        while let Some(c) = self.bump() {
            if c == '"' && (0..hashes).all(|i| self.peek(i) == Some('#')) {
                for _ in 0..hashes {
                    self.bump();
                }
                return;
            }
        }
    }

    /// At `'`: a character literal (skipped) or a lifetime or label, whose
    /// name then lexes as an identifier (harmless: it is never followed by `::`).
    fn quote(&mut self) {
        self.bump();
        match (self.peek(0), self.peek(1)) {
            (Some('\\'), _) => self.skip_quoted('\''),
            (Some(_), Some('\'')) => {
                self.bump();
                self.bump();
            }
            _ => {}
        }
    }

    fn ident_or_prefixed_literal(&mut self) -> Option<Tok> {
        let start = self.pos;
        while self.peek(0).is_some_and(is_ident_continue) {
            self.bump();
        }
        let word: String = self.chars[start..self.pos].iter().collect();
        match (word.as_str(), self.peek(0), self.peek(1)) {
            ("r" | "br" | "cr", Some('"'), _) | ("r" | "br" | "cr", Some('#'), Some('#' | '"')) => {
                self.skip_raw_string();
                None
            }
            ("r", Some('#'), Some(c)) if is_ident_start(c) => {
                // A raw identifier, `r#type`: kept with its prefix, so that
                // `r#crate` or `r#mod` is never taken for the keyword.
                self.bump();
                while self.peek(0).is_some_and(is_ident_continue) {
                    self.bump();
                }
                Some(Tok::Ident(self.chars[start..self.pos].iter().collect()))
            }
            ("b" | "c", Some('"'), _) => {
                self.bump();
                self.skip_quoted('"');
                None
            }
            ("b", Some('\''), _) => {
                self.bump();
                self.skip_quoted('\'');
                None
            }
            _ => Some(Tok::Ident(word)),
        }
    }
}

pub fn tokenize(source: &str) -> Vec<Token> {
    let mut lx = Lexer { chars: source.chars().collect(), pos: 0, line: 1 };
    let mut out = Vec::new();
    while let Some(c) = lx.peek(0) {
        let line = lx.line;
        match c {
            c if c.is_whitespace() => {
                lx.bump();
            }
            '/' if lx.peek(1) == Some('/') => lx.skip_line_comment(),
            '/' if lx.peek(1) == Some('*') => {
                lx.bump();
                lx.bump();
                lx.skip_block_comment();
            }
            '"' => {
                lx.bump();
                lx.skip_quoted('"');
            }
            '\'' => lx.quote(),
            c if c.is_ascii_digit() => {
                while lx.peek(0).is_some_and(is_ident_continue) {
                    lx.bump();
                }
            }
            c if is_ident_start(c) => {
                if let Some(tok) = lx.ident_or_prefixed_literal() {
                    out.push(Token { tok, line });
                }
            }
            ':' if lx.peek(1) == Some(':') => {
                lx.bump();
                lx.bump();
                out.push(Token { tok: Tok::PathSep, line });
            }
            c => {
                lx.bump();
                out.push(Token { tok: Tok::Punct(c), line });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{tokenize, Tok};

    fn idents(source: &str) -> Vec<String> {
        tokenize(source)
            .into_iter()
            .filter_map(|t| match t.tok {
                Tok::Ident(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn comments_strings_and_chars_hide_their_contents() {
        let source = r####"
            // use crate::line_comment;
            /* outer /* nested crate::a */ still comment crate::b */
            /// doc [`crate::doc`]
            let s = "crate::in_string \" crate::escaped";
            let r = r#"crate::raw " still"#;
            let b = b"crate::bytes"; let c = c"crate::c";
            let q = '{'; let e = '\''; let u = '\u{7b}';
            fn f<'a>(x: &'a str) {}
            kept
        "####;
        assert_eq!(idents(source), ["let", "s", "let", "r", "let", "b", "let", "c", "let", "q", "let", "e", "let", "u", "fn", "f", "a", "x", "a", "str", "kept"]);
    }

    #[test]
    fn paths_keep_their_lines() {
        let tokens = tokenize("a\n  crate::x\n r#mod");
        let seps: Vec<u32> = tokens.iter().filter(|t| t.tok == Tok::PathSep).map(|t| t.line).collect();
        assert_eq!(seps, [2]);
        assert_eq!(tokens.last().unwrap().tok, Tok::Ident("r#mod".into()));
        assert_eq!(tokens.last().unwrap().line, 3);
        // A brace inside a character literal is no token.
        assert!(!tokenize("'{'").iter().any(|t| t.tok == Tok::Punct('{')));
    }
}
