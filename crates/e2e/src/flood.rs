//! What the connection-flood tests and benches share: a lifted open-file
//! limit, a socket from a chosen loopback source address, and a client that
//! never finishes its request headers.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

/// Lifts the soft open-file limit to the hard one and panics (a test's
/// failure) when even that is below `needed`.
pub fn raise_open_file_limit(needed: u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    }
    assert!(hard >= needed, "the open file limit ({hard}) is too low for this test ({needed} needed)");
}

/// A TCP connection to `to` from `source` (any 127.0.0.0/8 address works
/// on Linux loopback), as a fleet of distinct clients would come.
pub async fn connect_from(source: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(to).await
}

/// Sends a request line, then a header line a second, never the blank
/// line that ends the headers; returns once the server closed.
pub async fn dribble(mut write: tokio::net::tcp::OwnedWriteHalf) {
    if write.write_all(b"GET /api/apps HTTP/1.1\r\n").await.is_err() {
        return;
    }
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if write.write_all(b"x-slow: 1\r\n").await.is_err() {
            return;
        }
    }
}
