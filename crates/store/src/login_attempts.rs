//! The login limiter's windows as the store keeps them (the limiter itself
//! is `cloudweb_core::auth::limiter`).

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start_ms: i64,
    pub attempts: u32,
}

/// Which table a key counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Account,
    Address,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Account => "account",
            Kind::Address => "address",
        }
    }

    pub fn parse(text: &str) -> Option<Kind> {
        match text {
            "account" => Some(Kind::Account),
            "address" => Some(Kind::Address),
            _ => None,
        }
    }
}

/// One key's window after a change, or `None` where the key was dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub kind: Kind,
    pub key: String,
    pub window: Option<Window>,
}
