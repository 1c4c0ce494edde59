//! Timestamps as the protocol carries them (RFC 3339, UTC). Below every
//! module that stamps what it reports (commands, the deploy log shipper), so
//! that none of them imports another for the clock.

/// Now, in RFC 3339 (empty in the impossible case that it cannot be
/// formatted).
pub fn now_rfc3339() -> String {
    ::time::OffsetDateTime::now_utc().format(&::time::format_description::well_known::Rfc3339).unwrap_or_default()
}

/// Now, in milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn now_is_rfc3339_utc_and_now() {
        let before = ::time::OffsetDateTime::now_utc();
        let text = super::now_rfc3339();
        let parsed = ::time::OffsetDateTime::parse(&text, &::time::format_description::well_known::Rfc3339).unwrap();
        assert!(text.ends_with('Z'), "{text}");
        assert!(parsed >= before - ::time::Duration::seconds(1) && parsed <= ::time::OffsetDateTime::now_utc(), "{text}");
    }
}
