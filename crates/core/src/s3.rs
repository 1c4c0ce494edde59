//! What the control plane checks of an S3-compatible endpoint, for backup
//! destinations and the registry's storage: an endpoint URL, a bucket
//! name, an object-key prefix, and whether the endpoint takes a connection.

use std::time::Duration;

/// How long the first connection to an S3 endpoint may take (restic and
/// the registry's driver themselves retry a refused connection for
/// minutes).
pub const CONNECT_LIMIT: Duration = Duration::from_secs(5);

/// An endpoint as `http(s)://host[:port]`, without a path, a query or
/// credentials: its scheme and `host[:port]`.
pub fn endpoint(value: &str) -> Result<(String, String), String> {
    let url = url::Url::parse(value).map_err(|e| format!("endpoint: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() || url.path() != "/" || url.query().is_some() || !url.username().is_empty() || url.password().is_some() {
        return Err("endpoint must be http(s)://host[:port], without a path or credentials".into());
    }
    let host = match url.port() {
        Some(port) => format!("{}:{port}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_string(),
    };
    Ok((url.scheme().to_string(), host))
}

/// A bucket name as S3 allows it: 3 to 63 of a-z, 0-9, '.', '-'.
pub fn bucket(value: &str) -> Result<(), String> {
    let ok = (3..=63).contains(&value.len())
        && value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        && value.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err("bucket must be 3 to 63 of a-z, 0-9, '.' and '-'".into())
    }
}

/// A region: 1 to 64 of a-z, 0-9 and '-'.
pub fn region(value: &str) -> Result<(), String> {
    if (1..=64).contains(&value.len()) && value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        Ok(())
    } else {
        Err("region must be 1 to 64 of a-z, 0-9 and '-'".into())
    }
}

/// `/`-separated names of A-Z, a-z, 0-9, '.', '_' and '-' (a prefix of
/// object keys, or a path).
pub fn plain_path(field: &str, value: &str) -> Result<(), String> {
    if value.len() > 512 || value.split('/').any(|p| p.is_empty() || p == "." || p == ".." || !p.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))) {
        return Err(format!("{field} must be /-separated names of A-Z, a-z, 0-9, '.', '_' and '-'"));
    }
    Ok(())
}

/// Whether the endpoint takes a TCP connection within [`CONNECT_LIMIT`]:
/// an answer in seconds, rather than after a client's retries.
pub async fn reachable(endpoint: &str) -> Result<(), String> {
    let url = url::Url::parse(endpoint).map_err(|e| format!("endpoint: {e}"))?;
    let host = url.host_str().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_string();
    let port = url.port_or_known_default().unwrap_or(443);
    match tokio::time::timeout(CONNECT_LIMIT, tokio::net::TcpStream::connect((host.as_str(), port))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(err)) => Err(format!("cannot connect to {host}:{port}: {err}")),
        Err(_) => Err(format!("no connection to {host}:{port} within {} s", CONNECT_LIMIT.as_secs())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_buckets_regions_and_prefixes_are_checked() {
        assert_eq!(endpoint("http://10.0.0.5:9000").unwrap(), ("http".into(), "10.0.0.5:9000".into()));
        assert_eq!(endpoint("https://s3.example.com").unwrap(), ("https".into(), "s3.example.com".into()));
        for bad in ["ftp://x", "https://h/path", "https://u:p@h", "https://h?q=1", "h:9000"] {
            assert!(endpoint(bad).is_err(), "{bad}");
        }
        bucket("images.cluster-1").unwrap();
        for bad in ["UPPER", "ab", "-dash", &"a".repeat(64)] {
            assert!(bucket(bad).is_err(), "{bad}");
        }
        region("eu-west-1").unwrap();
        assert!(region("").is_err() && region("EU").is_err());
        plain_path("prefix", "cluster/registry").unwrap();
        for bad in ["a//b", "../x", "a b", "/abs"] {
            assert!(plain_path("prefix", bad).is_err(), "{bad}");
        }
    }
}
