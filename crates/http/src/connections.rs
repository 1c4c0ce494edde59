//! What both listeners (the agent listener and the user API) do to keep
//! their connections bounded: a table of the connections held with caps in
//! total and per source address (past a cap the oldest idle one is shed),
//! a record of each connection's activity that says when it has waited too
//! long (for its headers, or idle between requests), and an accept loop's
//! back-off when the process is out of descriptors.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The connections held, oldest first, with the signal that sheds each.
/// New connections are always admitted; the caps are kept by shedding
/// held ones, in this order: the oldest that has not had a request yet
/// (idle since its accept, or still sending its first headers), then the
/// one idle the longest since its last request, then the oldest of all;
/// never the connection being admitted. A connection that never made a request is the one most likely held on
/// purpose, and a client between requests the cheapest to lose (it
/// connects again); one with a request in flight goes last.
#[derive(Debug)]
pub struct ConnectionTable {
    max_total: usize,
    max_per_address: usize,
    inner: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    next_id: u64,
    by_age: BTreeMap<u64, Entry>,
    per_address: HashMap<IpAddr, usize>,
    shed: u64,
}

#[derive(Debug)]
struct Entry {
    address: IpAddr,
    shed: Arc<Notify>,
    /// `None`: always counts as idle.
    activity: Option<Arc<Activity>>,
}

/// Where a connection stands when a victim is chosen.
enum Standing {
    /// No request yet, none in flight.
    Fresh,
    /// Between requests since then.
    Idle(Instant),
    Busy,
}

impl Entry {
    fn standing(&self) -> Standing {
        match &self.activity {
            None => Standing::Fresh,
            Some(activity) => activity.standing(),
        }
    }
}

/// One admitted connection's place in a [`ConnectionTable`]; leaves it on
/// drop or on [`Ticket::release`].
pub struct Ticket {
    id: u64,
    shed: Arc<Notify>,
    held: Arc<ConnectionTable>,
}

impl ConnectionTable {
    pub fn new(max_total: usize, max_per_address: usize) -> Arc<ConnectionTable> {
        Arc::new(ConnectionTable { max_total: max_total.max(1), max_per_address: max_per_address.max(1), inner: Mutex::new(Held::default()) })
    }

    /// Admits a connection from `address`, shedding held ones over either
    /// cap. With its `activity`, a connection with a request in flight is
    /// shed only when no idle one is left to shed.
    pub fn admit(self: &Arc<Self>, address: IpAddr, activity: Option<Arc<Activity>>) -> Ticket {
        let mut held = self.inner.lock().expect("connection table lock");
        let id = held.next_id;
        held.next_id += 1;
        let shed = Arc::new(Notify::new());
        held.by_age.insert(id, Entry { address, shed: shed.clone(), activity });
        *held.per_address.entry(address).or_default() += 1;
        while held.per_address.get(&address).copied().unwrap_or(0) > self.max_per_address {
            match held.victim(Some(address), id) {
                Some(victim) => held.shed(victim),
                None => break,
            }
        }
        while held.by_age.len() > self.max_total {
            match held.victim(None, id) {
                Some(victim) => held.shed(victim),
                None => break,
            }
        }
        Ticket { id, shed, held: self.clone() }
    }

    /// Connections held now.
    pub fn len(&self) -> usize {
        self.inner.lock().expect("connection table lock").by_age.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Connections shed so far.
    pub fn shed_total(&self) -> u64 {
        self.inner.lock().expect("connection table lock").shed
    }

    fn release(&self, id: u64) {
        self.inner.lock().expect("connection table lock").remove(id);
    }
}

impl Held {
    /// The connection to shed (among those from `address`, when given),
    /// never the newcomer `admitted`: see [`ConnectionTable`] for the order.
    fn victim(&self, address: Option<IpAddr>, admitted: u64) -> Option<u64> {
        let mut longest_idle: Option<(u64, Instant)> = None;
        let mut oldest = None;
        for (id, entry) in &self.by_age {
            if *id == admitted || address.is_some_and(|a| a != entry.address) {
                continue;
            }
            match entry.standing() {
                Standing::Fresh => return Some(*id),
                Standing::Idle(since) => {
                    if longest_idle.is_none_or(|(_, longest)| since < longest) {
                        longest_idle = Some((*id, since));
                    }
                }
                Standing::Busy => {
                    oldest.get_or_insert(*id);
                }
            }
        }
        longest_idle.map(|(id, _)| id).or(oldest)
    }

    fn remove(&mut self, id: u64) -> Option<Arc<Notify>> {
        let entry = self.by_age.remove(&id)?;
        if let Some(count) = self.per_address.get_mut(&entry.address) {
            *count -= 1;
            if *count == 0 {
                self.per_address.remove(&entry.address);
            }
        }
        Some(entry.shed)
    }

    fn shed(&mut self, id: u64) {
        if let Some(signal) = self.remove(id) {
            self.shed += 1;
            // Stored if the connection is not waiting yet.
            signal.notify_one();
        }
    }
}

impl Ticket {
    /// Leaves the table (the agent listener: the handshake proved a client
    /// certificate); the connection is no longer counted nor shed.
    pub fn release(&self) {
        self.held.release(self.id);
    }

    /// Resolves when this connection has been shed.
    pub async fn shed(&self) {
        self.shed.notified().await
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.held.release(self.id);
    }
}

/// One connection's requests in flight, when it last had one, and since
/// when it has been waiting for a request's headers.
#[derive(Debug)]
pub struct Activity {
    state: Mutex<ActivityState>,
    /// Told whenever a deadline may have moved.
    changed: Notify,
}

#[derive(Debug)]
struct ActivityState {
    in_flight: usize,
    /// The end of the last request (or the accept).
    last: Instant,
    /// The first byte of a request whose headers are not complete yet (or
    /// the accept, for the first request).
    awaiting_headers: Option<Instant>,
    /// Requests whose headers came in.
    requests: u64,
}

/// Marks a request in flight until its response body is done or dropped.
pub struct InFlight(Arc<Activity>);

impl Activity {
    /// A connection accepted at `accepted`; `awaiting_headers` when its
    /// first request's headers are timed from the accept.
    pub fn new(accepted: Instant, awaiting_headers: bool) -> Arc<Activity> {
        Arc::new(Activity {
            state: Mutex::new(ActivityState { in_flight: 0, last: accepted, awaiting_headers: awaiting_headers.then_some(accepted), requests: 0 }),
            changed: Notify::new(),
        })
    }

    /// A request's headers are in: it is in flight until the returned
    /// guard drops.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        {
            let mut state = self.state.lock().expect("activity lock");
            state.in_flight += 1;
            state.requests += 1;
            state.awaiting_headers = None;
            state.last = Instant::now();
        }
        self.changed.notify_one();
        InFlight(self.clone())
    }

    /// Bytes came in: between requests, a request has started.
    fn received(&self) {
        let mut state = self.state.lock().expect("activity lock");
        if state.in_flight == 0 && state.awaiting_headers.is_none() {
            state.awaiting_headers = Some(Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }

    fn standing(&self) -> Standing {
        let state = self.state.lock().expect("activity lock");
        match (state.in_flight, state.requests) {
            (0, 0) => Standing::Fresh,
            (0, _) => Standing::Idle(state.last),
            _ => Standing::Busy,
        }
    }

    /// Resolves once the connection had nothing in flight for `idle`, or
    /// (with `headers`) waited that long for a request's headers. A long
    /// request (an event stream, a download) never expires.
    pub async fn expired(&self, idle: Duration, headers: Option<Duration>) {
        loop {
            let deadline = {
                let state = self.state.lock().expect("activity lock");
                if state.in_flight > 0 {
                    None
                } else {
                    let idle_end = state.last + idle;
                    match (headers, state.awaiting_headers) {
                        (Some(limit), Some(since)) => Some(idle_end.min(since + limit)),
                        _ => Some(idle_end),
                    }
                }
            };
            match deadline {
                Some(deadline) if deadline <= Instant::now() => return,
                Some(deadline) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(deadline) => {}
                        () = self.changed.notified() => {}
                    }
                }
                None => self.changed.notified().await,
            }
        }
    }
}

impl InFlight {
    /// Keeps this request in flight until `response`'s body is sent.
    pub fn hold<B>(self, response: http::Response<B>) -> http::Response<axum::body::Body>
    where
        B: axum::body::HttpBody<Data = axum::body::Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        response.map(|body| {
            axum::body::Body::new(body.map_frame(move |frame| {
                let _ = &self;
                frame
            }))
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        {
            let mut state = self.0.state.lock().expect("activity lock");
            state.last = Instant::now();
            state.in_flight -= 1;
            // Bytes read while it was in flight were its own body's.
            state.awaiting_headers = None;
        }
        self.0.changed.notify_one();
    }
}

/// A socket that tells its [`Activity`] when bytes come in, so a request's
/// headers are timed from its first byte and not from the end of the one
/// before (which is the idle limit's business).
pub struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Watched<S> {
    pub fn new(inner: S, activity: Arc<Activity>) -> Watched<S> {
        Watched { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.received();
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Accepts the next connection, waiting out failures: out of descriptors
/// (EMFILE, ENFILE) or any other error is logged at most once per ten
/// seconds per listener, with the count since, and retried after a short
/// pause, so that the loop neither spins nor ends.
pub async fn accept(listener: &tokio::net::TcpListener, name: &'static str, errors: &mut AcceptErrors) -> (tokio::net::TcpStream, std::net::SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(conn) => return conn,
            Err(err) => {
                errors.failed(name, &err);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Failed accepts since the last one logged.
#[derive(Debug, Default)]
pub struct AcceptErrors {
    logged: Option<Instant>,
    since: u64,
}

impl AcceptErrors {
    const INTERVAL: Duration = Duration::from_secs(10);

    fn failed(&mut self, name: &'static str, err: &std::io::Error) {
        self.since += 1;
        if self.logged.is_none_or(|at| at.elapsed() >= Self::INTERVAL) {
            tracing::warn!(listener = name, error = %err, failures = self.since, "accept failed (usually out of file descriptors); retrying");
            self.logged = Some(Instant::now());
            self.since = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([192, 0, 2, last])
    }

    #[tokio::test]
    async fn the_oldest_connections_are_shed_first() {
        let held = ConnectionTable::new(4, 2);
        let a1 = held.admit(ip(1), None);
        let a2 = held.admit(ip(1), None);
        // A third from the same address sheds that address's oldest.
        let a3 = held.admit(ip(1), None);
        tokio::time::timeout(Duration::from_millis(100), a1.shed()).await.expect("a1 shed");
        assert_eq!(held.len(), 2);
        let b1 = held.admit(ip(2), None);
        let b2 = held.admit(ip(2), None);
        assert_eq!(held.len(), 4);
        // Over the total: the oldest of all (a2) goes, not the newcomer.
        let _c1 = held.admit(ip(3), None);
        tokio::time::timeout(Duration::from_millis(100), a2.shed()).await.expect("a2 shed");
        assert_eq!(held.len(), 4);
        // A released connection leaves the table and is never shed.
        b1.release();
        assert_eq!(held.len(), 3);
        let _c2 = held.admit(ip(3), None);
        let _c3 = held.admit(ip(4), None);
        assert!(tokio::time::timeout(Duration::from_millis(50), b1.shed()).await.is_err(), "b1 was released");
        tokio::time::timeout(Duration::from_millis(100), a3.shed()).await.expect("a3 shed");
        drop(b2);
        assert_eq!(held.len(), 3);
        assert_eq!(held.shed_total(), 3);
    }

    async fn is_shed(ticket: &Ticket) -> bool {
        tokio::time::timeout(Duration::from_millis(10), ticket.shed()).await.is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn connections_without_a_request_go_first_then_the_longest_idle_then_busy_ones() {
        let held = ConnectionTable::new(3, 2);
        let activity = || Activity::new(Instant::now(), true);
        let admit = |last: u8| {
            let activity = activity();
            (held.admit(ip(last), Some(activity.clone())), activity)
        };
        let (a1, a1_activity) = admit(1);
        let a1_request = a1_activity.begin();
        let (a2, _) = admit(1);
        // The address's third: its fresh a2 goes, though a1 is older.
        let (a3, _) = admit(1);
        assert!(is_shed(&a2).await && !is_shed(&a1).await && !is_shed(&a3).await);
        let (b1, b1_activity) = admit(2);
        drop(b1_activity.begin());
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(a1_request);
        // Over the total: the fresh a3 goes before a1 and b1, which had
        // requests (and the newcomer is never the one shed).
        let (c1, c1_activity) = admit(3);
        assert!(is_shed(&a3).await && !is_shed(&c1).await);
        let c1_request = c1_activity.begin();
        // No fresh one left: b1, idle for 5 s, goes before a1, idle for 0 s.
        let (d1, d1_activity) = admit(4);
        assert!(is_shed(&b1).await && !is_shed(&a1).await);
        let d1_request = d1_activity.begin();
        let (e1, e1_activity) = admit(5);
        assert!(is_shed(&a1).await);
        let e1_request = e1_activity.begin();
        // Every one busy: the oldest goes.
        let (f1, _) = admit(6);
        assert!(is_shed(&c1).await && !is_shed(&d1).await && !is_shed(&e1).await && !is_shed(&f1).await);
        assert_eq!(held.len(), 3);
        assert_eq!(held.shed_total(), 5);
        drop((c1_request, d1_request, e1_request));
    }

    #[tokio::test(start_paused = true)]
    async fn headers_are_timed_from_their_first_byte_and_idleness_from_the_last_request() {
        let limit = |activity: Arc<Activity>| async move {
            let started = Instant::now();
            activity.expired(Duration::from_secs(60), Some(Duration::from_secs(10))).await;
            started.elapsed()
        };
        // Nothing sent: the header limit from the accept.
        let silent = Activity::new(Instant::now(), true);
        assert_eq!(limit(silent).await, Duration::from_secs(10));
        // A request answered, then nothing: the idle limit.
        let kept = Activity::new(Instant::now(), true);
        drop(kept.begin());
        assert_eq!(limit(kept.clone()).await, Duration::from_secs(60));
        // After a request, a byte of the next one: the header limit again.
        drop(kept.begin());
        let waiting = tokio::spawn(limit(kept.clone()));
        tokio::time::sleep(Duration::from_secs(5)).await;
        kept.received();
        assert_eq!(waiting.await.unwrap(), Duration::from_secs(15));
        // In flight: never, until it ends.
        let streaming = Activity::new(Instant::now(), true);
        let request = streaming.begin();
        let waiting = tokio::spawn(limit(streaming.clone()));
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!waiting.is_finished());
        drop(request);
        assert_eq!(waiting.await.unwrap(), Duration::from_secs(660));
    }
}
