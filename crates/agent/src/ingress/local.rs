//! Two tiny HTTP responders on loopback that Caddy calls:
//! - the upstream of a host without a healthy instance, which answers 503;
//! - the permission check of on-demand TLS: Caddy asks
//!   `GET /?domain=<host>` before it obtains a certificate, and only hosts
//!   of the route table in force get a 200.
//!
//! Both read a bounded request head and close the connection after one
//! answer.

use std::borrow::Cow;
use std::collections::HashSet;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The hosts a certificate may be obtained for.
#[derive(Clone, Default)]
pub struct Allowed {
    hosts: Arc<RwLock<Arc<HashSet<String>>>>,
}

impl Allowed {
    pub fn replace(&self, hosts: HashSet<String>) {
        *self.hosts.write().expect("hosts lock") = Arc::new(hosts);
    }

    pub fn permits(&self, host: &str) -> bool {
        self.hosts.read().expect("hosts lock").contains(&host.to_ascii_lowercase())
    }
}

/// Serves the 503 upstream on `preferred` when it is free; returns its
/// address.
pub async fn serve_unavailable(preferred: u16) -> std::io::Result<SocketAddr> {
    serve(preferred, |_target| async { (503, Cow::Borrowed("no healthy instance\n")) }).await
}

/// Serves the on-demand TLS permission check on `preferred` when it is
/// free; returns its address.
pub async fn serve_permission(allowed: Allowed, preferred: u16) -> std::io::Result<SocketAddr> {
    serve(preferred, move |target| {
        let domain = target.split_once('?').map(|(_, query)| query).unwrap_or("").split('&').find_map(|pair| pair.strip_prefix("domain="));
        let answer = match domain {
            Some(domain) if allowed.permits(domain) => (200, Cow::Borrowed("ok\n")),
            _ => (403, Cow::Borrowed("not a host of this ingress\n")),
        };
        async move { answer }
    })
    .await
}

/// Serves `answer(request target)` on loopback, one answer per connection.
pub(super) async fn serve<F, Fut>(preferred: u16, answer: F) -> std::io::Result<SocketAddr>
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = (u16, Cow<'static, str>)> + Send + 'static,
{
    let listener = match TcpListener::bind((Ipv4Addr::LOCALHOST, preferred)).await {
        Ok(listener) => listener,
        Err(_) if preferred != 0 => TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?,
        Err(err) => return Err(err),
    };
    let address = listener.local_addr()?;
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let answer = answer.clone();
            tokio::spawn(async move { respond(stream, &*answer).await });
        }
    });
    Ok(address)
}

async fn respond<F, Fut>(mut stream: TcpStream, answer: &F)
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = (u16, Cow<'static, str>)>,
{
    let mut head = Vec::new();
    let mut buffer = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > 16 * 1024 {
            return;
        }
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer)).await {
            Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buffer[..n]),
            _ => return,
        }
    }
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let target = std::str::from_utf8(line).ok().and_then(|l| l.split(' ').nth(1)).unwrap_or("").to_string();
    let (status, body) = answer(target).await;
    let reason = match status {
        200 => "OK",
        403 => "Forbidden",
        404 => "Not Found",
        502 => "Bad Gateway",
        _ => "Service Unavailable",
    };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(address: SocketAddr, target: &str) -> String {
        let mut stream = TcpStream::connect(address).await.unwrap();
        stream.write_all(format!("GET {target} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn the_unavailable_upstream_answers_503() {
        let address = serve_unavailable(0).await.unwrap();
        let response = get(address, "/any/path").await;
        assert!(response.starts_with("HTTP/1.1 503"), "{response}");
        assert!(response.ends_with("no healthy instance\n"));
    }

    #[tokio::test]
    async fn only_hosts_in_force_get_a_certificate() {
        let allowed = Allowed::default();
        allowed.replace(HashSet::from(["web.test".to_string()]));
        let address = serve_permission(allowed.clone(), 0).await.unwrap();
        assert!(get(address, "/?domain=web.test").await.starts_with("HTTP/1.1 200"));
        assert!(get(address, "/?domain=WEB.test").await.starts_with("HTTP/1.1 200"));
        assert!(get(address, "/?domain=other.test").await.starts_with("HTTP/1.1 403"));
        assert!(get(address, "/").await.starts_with("HTTP/1.1 403"));
        allowed.replace(HashSet::new());
        assert!(get(address, "/?domain=web.test").await.starts_with("HTTP/1.1 403"), "a removed host loses permission");
    }
}
