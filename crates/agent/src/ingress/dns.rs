//! The upstream directory Caddy reads instead of a static upstream list.
//!
//! Every Caddy reload closes the old server's idle keep-alive connections,
//! and an HTTP/1.1 client that sends a request on one of them at that moment
//! loses it. So a route whose hosts stay the same but whose instances change
//! (every blue/green switch) must not reload Caddy. Each host's reverse
//! proxy therefore takes its upstreams from an SRV lookup of a stable name,
//! answered by this tiny DNS responder on loopback, which the agent updates
//! in place. Caddy re-reads a name at most every [`REFRESH`].
//!
//! Names (all under `cloudweb.`, never forwarded anywhere):
//! - `<host>.h.cloudweb.`: SRV, one record per upstream of a host. Caddy
//!   builds the name from the request's host, so one proxy handler serves
//!   every host.
//! - `4-a-b-c-d.a.cloudweb.`: A, the IPv4 address it spells.
//! - `6-<32 hex>.a.cloudweb.`: AAAA, the IPv6 address it spells.
//!
//! A host without a healthy instance points at the agent's own 503 responder
//! so that Caddy never sees an empty answer (it would treat one as a lookup
//! error and keep serving stale upstreams).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::net::UdpSocket;

/// How long Caddy may use an answer before asking again. A switch counts as
/// applied only once this has passed after the directory changed.
pub const REFRESH: Duration = Duration::from_millis(250);

const HOSTS: &str = "h.cloudweb.";
const ADDRESSES: &str = "a.cloudweb.";
const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const TYPE_SRV: u16 = 33;
const TYPE_OPT: u16 = 41;
const CLASS_IN: u16 = 1;
const RCODE_FORMERR: u16 = 1;
const RCODE_NXDOMAIN: u16 = 3;
const RCODE_NOTIMP: u16 = 4;
/// Answers larger than the client's buffer are cut to whole records, never
/// truncated with TC: Caddy's resolver would retry over TCP on the same UDP
/// socket. 1232 bytes hold about 28 upstreams per host.
const PLAIN_UDP_SIZE: usize = 512;

/// The lookup name of a host's upstreams.
pub fn service_name(host: &str) -> String {
    format!("{}.{HOSTS}", host.to_ascii_lowercase())
}

/// The SRV name Caddy looks up, from the request's host.
pub const SERVICE_PLACEHOLDER: &str = "{http.request.host}.h.cloudweb.";

/// The name that resolves to `ip`.
pub fn address_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            format!("4-{a}-{b}-{c}-{d}.{ADDRESSES}")
        }
        IpAddr::V6(v6) => format!("6-{}.{ADDRESSES}", hex::encode(v6.octets())),
    }
}

fn parse_address_name(name: &str) -> Option<IpAddr> {
    let label = name.strip_suffix(ADDRESSES)?.strip_suffix('.')?;
    if let Some(v4) = label.strip_prefix("4-") {
        let parts: Vec<u8> = v4.split('-').map(|p| p.parse().ok()).collect::<Option<_>>()?;
        let octets: [u8; 4] = parts.try_into().ok()?;
        return Some(IpAddr::V4(Ipv4Addr::from(octets)));
    }
    if let Some(v6) = label.strip_prefix("6-") {
        let bytes: [u8; 16] = hex::decode(v6).ok()?.try_into().ok()?;
        return Some(IpAddr::V6(Ipv6Addr::from(bytes)));
    }
    None
}

/// One SRV record: the address name and port of an upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub name: String,
    pub port: u16,
}

impl Target {
    pub fn of(address: SocketAddr) -> Target {
        Target { name: address_name(address.ip()), port: address.port() }
    }
}

/// Service name → targets. Swapped whole on every change.
#[derive(Clone, Default)]
pub struct Directory {
    zone: Arc<RwLock<Arc<HashMap<String, Vec<Target>>>>>,
}

impl Directory {
    pub fn replace(&self, zone: HashMap<String, Vec<Target>>) {
        *self.zone.write().expect("zone lock") = Arc::new(zone);
    }

    fn current(&self) -> Arc<HashMap<String, Vec<Target>>> {
        self.zone.read().expect("zone lock").clone()
    }

    /// Answers one query packet; `None` for a packet too broken to answer.
    pub fn answer(&self, query: &[u8]) -> Option<Vec<u8>> {
        let header = query.get(..12)?;
        let id = [header[0], header[1]];
        let flags = u16::from_be_bytes([header[2], header[3]]);
        if flags & 0x8000 != 0 {
            return None; // a response, not a query
        }
        let qdcount = u16::from_be_bytes([header[4], header[5]]);
        let arcount = u16::from_be_bytes([header[10], header[11]]);
        let opcode = (flags >> 11) & 0xf;
        let reply = |rcode: u16, question: &[u8], answers: &[Vec<u8>]| {
            // QR, AA and RA set; RD echoed.
            let flags = 0x8000 | (opcode << 11) | 0x0400 | (flags & 0x0100) | 0x0080 | rcode;
            let mut out = Vec::with_capacity(512);
            out.extend_from_slice(&id);
            out.extend_from_slice(&flags.to_be_bytes());
            out.extend_from_slice(&(u16::from(!question.is_empty())).to_be_bytes());
            out.extend_from_slice(&(answers.len() as u16).to_be_bytes());
            out.extend_from_slice(&[0, 0, 0, 0]);
            out.extend_from_slice(question);
            for answer in answers {
                out.extend_from_slice(answer);
            }
            out
        };
        if opcode != 0 {
            return Some(reply(RCODE_NOTIMP, &[], &[]));
        }
        if qdcount != 1 {
            return Some(reply(RCODE_FORMERR, &[], &[]));
        }
        let Some((name, after_name)) = read_name(query, 12) else {
            return Some(reply(RCODE_FORMERR, &[], &[]));
        };
        let Some(fixed) = query.get(after_name..after_name + 4) else {
            return Some(reply(RCODE_FORMERR, &[], &[]));
        };
        let qtype = u16::from_be_bytes([fixed[0], fixed[1]]);
        let qclass = u16::from_be_bytes([fixed[2], fixed[3]]);
        let question = &query[12..after_name + 4];
        let limit = if arcount > 0 { edns_size(query, after_name + 4).unwrap_or(PLAIN_UDP_SIZE) } else { PLAIN_UDP_SIZE };

        let mut answers = Vec::new();
        let zone = self.current();
        if let Some(targets) = zone.get(&name) {
            if qtype == TYPE_SRV && qclass == CLASS_IN {
                for target in targets {
                    answers.push(srv_record(target));
                }
            }
        } else if let Some(ip) = parse_address_name(&name) {
            match (ip, qtype) {
                (IpAddr::V4(v4), TYPE_A) if qclass == CLASS_IN => answers.push(record(TYPE_A, &v4.octets())),
                (IpAddr::V6(v6), TYPE_AAAA) if qclass == CLASS_IN => answers.push(record(TYPE_AAAA, &v6.octets())),
                _ => {}
            }
        } else {
            return Some(reply(RCODE_NXDOMAIN, question, &[]));
        }
        // Keep whole records within the client's buffer.
        let mut size = 12 + question.len();
        let mut kept = 0;
        for answer in &answers {
            if size + answer.len() > limit {
                break;
            }
            size += answer.len();
            kept += 1;
        }
        answers.truncate(kept);
        Some(reply(0, question, &answers))
    }
}

/// Reads an uncompressed name at `offset`, lowercased with a trailing dot.
fn read_name(packet: &[u8], mut offset: usize) -> Option<(String, usize)> {
    let mut name = String::new();
    loop {
        let len = *packet.get(offset)? as usize;
        offset += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None; // compression pointers have no place in a question
        }
        let label = packet.get(offset..offset + len)?;
        if !label.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_') {
            return None;
        }
        name.push_str(&String::from_utf8_lossy(label).to_ascii_lowercase());
        name.push('.');
        offset += len;
        if name.len() > 255 {
            return None;
        }
    }
    if name.is_empty() {
        name.push('.');
    }
    Some((name, offset))
}

/// The UDP payload size an EDNS OPT record in the additional section asks
/// for (RFC 6891), if the packet carries one right after the question.
fn edns_size(packet: &[u8], offset: usize) -> Option<usize> {
    // Root name (one zero byte), then TYPE and CLASS (= the payload size).
    if *packet.get(offset)? != 0 {
        return None;
    }
    let rest = packet.get(offset + 1..offset + 5)?;
    if u16::from_be_bytes([rest[0], rest[1]]) != TYPE_OPT {
        return None;
    }
    let size = u16::from_be_bytes([rest[2], rest[3]]) as usize;
    Some(size.clamp(PLAIN_UDP_SIZE, 4096))
}

/// An answer record whose name points back at the question (offset 12).
fn record(rtype: u16, rdata: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + rdata.len());
    out.extend_from_slice(&[0xc0, 0x0c]);
    out.extend_from_slice(&rtype.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes()); // TTL: Caddy caches by its own refresh
    out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
    out.extend_from_slice(rdata);
    out
}

fn srv_record(target: &Target) -> Vec<u8> {
    let mut rdata = Vec::with_capacity(8 + target.name.len());
    rdata.extend_from_slice(&10u16.to_be_bytes()); // priority
    rdata.extend_from_slice(&10u16.to_be_bytes()); // weight
    rdata.extend_from_slice(&target.port.to_be_bytes());
    for label in target.name.trim_end_matches('.').split('.') {
        rdata.push(label.len() as u8);
        rdata.extend_from_slice(label.as_bytes());
    }
    rdata.push(0);
    record(TYPE_SRV, &rdata)
}

/// Serves the directory on a loopback UDP port, `preferred` when it is free
/// (so a Caddy that outlived the agent finds it again); returns the bound
/// address.
pub async fn serve(directory: Directory, preferred: u16) -> std::io::Result<SocketAddr> {
    let socket = match UdpSocket::bind((Ipv4Addr::LOCALHOST, preferred)).await {
        Ok(socket) => socket,
        Err(_) if preferred != 0 => UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await?,
        Err(err) => return Err(err),
    };
    let address = socket.local_addr()?;
    tokio::spawn(async move {
        let mut buffer = vec![0u8; 4096];
        loop {
            let (len, peer) = match socket.recv_from(&mut buffer).await {
                Ok(received) => received,
                Err(err) => {
                    tracing::warn!(error = %err, "upstream directory receive failed");
                    continue;
                }
            };
            if let Some(reply) = directory.answer(&buffer[..len]) {
                let _ = socket.send_to(&reply, peer).await;
            }
        }
    });
    Ok(address)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16, edns: Option<u16>) -> Vec<u8> {
        let mut out = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, u8::from(edns.is_some())];
        for label in name.trim_end_matches('.').split('.') {
            out.push(label.len() as u8);
            out.extend_from_slice(label.as_bytes());
        }
        out.push(0);
        out.extend_from_slice(&qtype.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        if let Some(size) = edns {
            out.push(0);
            out.extend_from_slice(&TYPE_OPT.to_be_bytes());
            out.extend_from_slice(&size.to_be_bytes());
            out.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        }
        out
    }

    fn counts(reply: &[u8]) -> (u16, u16) {
        (u16::from_be_bytes([reply[2], reply[3]]) & 0xf, u16::from_be_bytes([reply[6], reply[7]]))
    }

    #[test]
    fn names_round_trip() {
        for ip in ["127.0.0.1", "10.77.0.2", "::1", "fd00::42"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(parse_address_name(&address_name(ip)), Some(ip));
        }
        assert_eq!(parse_address_name("4-1-2-3.a.cloudweb."), None);
        assert_eq!(parse_address_name("4-1-2-3-256.a.cloudweb."), None);
        assert_eq!(parse_address_name("4-1-2-3-4.h.cloudweb."), None, "a host name never reads as an address");
        assert_eq!(service_name("Web.Test"), "web.test.h.cloudweb.");
        assert_eq!(SERVICE_PLACEHOLDER.replace("{http.request.host}", "web.test"), service_name("web.test"));
    }

    #[test]
    fn answers_srv_a_and_aaaa() {
        let directory = Directory::default();
        let service = service_name("web.test");
        directory.replace(HashMap::from([(
            service.clone(),
            vec![Target::of("127.0.0.1:32768".parse().unwrap()), Target::of("[fd00::2]:30000".parse().unwrap())],
        )]));
        let reply = directory.answer(&query(&service, TYPE_SRV, Some(1232))).unwrap();
        assert_eq!(&reply[..2], &[0x12, 0x34], "the id is echoed");
        assert_eq!(reply[2] & 0x84, 0x84, "a response, authoritative");
        assert_eq!(counts(&reply), (0, 2));
        assert!(reply.windows(2).any(|w| w == 32768u16.to_be_bytes()), "the port is in the answer");

        let a = directory.answer(&query("4-127-0-0-1.a.cloudweb.", TYPE_A, None)).unwrap();
        assert_eq!(counts(&a), (0, 1));
        assert_eq!(&a[a.len() - 4..], &[127, 0, 0, 1]);
        let none = directory.answer(&query("4-127-0-0-1.a.cloudweb.", TYPE_AAAA, None)).unwrap();
        assert_eq!(counts(&none), (0, 0), "no AAAA for an IPv4 name, but the name exists");
        let v6 = directory.answer(&query(&address_name("fd00::2".parse().unwrap()), TYPE_AAAA, None)).unwrap();
        assert_eq!(counts(&v6), (0, 1));

        // Names are case-insensitive.
        let upper = directory.answer(&query(&service.to_uppercase(), TYPE_SRV, None)).unwrap();
        assert_eq!(counts(&upper), (0, 2));
    }

    #[test]
    fn unknown_and_broken_queries() {
        let directory = Directory::default();
        let missing = directory.answer(&query("nobody.test.h.cloudweb.", TYPE_SRV, None)).unwrap();
        assert_eq!(counts(&missing), (RCODE_NXDOMAIN, 0));
        assert_eq!(directory.answer(&[1, 2, 3]), None, "shorter than a header");
        let mut truncated = query("web.cloudweb.", TYPE_SRV, None);
        truncated.truncate(truncated.len() - 3);
        assert_eq!(counts(&directory.answer(&truncated).unwrap()).0, RCODE_FORMERR);
        let mut pointer = query("web.cloudweb.", TYPE_SRV, None);
        pointer[12] = 0xc0;
        assert_eq!(counts(&directory.answer(&pointer).unwrap()).0, RCODE_FORMERR);
        let mut update = query("web.cloudweb.", TYPE_SRV, None);
        update[2] = 0x28; // opcode 5 (UPDATE)
        assert_eq!(counts(&directory.answer(&update).unwrap()).0, RCODE_NOTIMP);
        let mut response = query("web.cloudweb.", TYPE_SRV, None);
        response[2] |= 0x80;
        assert_eq!(directory.answer(&response), None, "responses are never answered");
    }

    #[test]
    fn large_answers_keep_whole_records_within_the_buffer() {
        let directory = Directory::default();
        let service = service_name("big.test");
        let targets: Vec<Target> = (0..100).map(|i| Target::of(SocketAddr::from(([10, 0, 0, i as u8], 30000 + i)))).collect();
        directory.replace(HashMap::from([(service.clone(), targets)]));
        let plain = directory.answer(&query(&service, TYPE_SRV, None)).unwrap();
        assert!(plain.len() <= 512);
        let (_, kept_plain) = counts(&plain);
        let edns = directory.answer(&query(&service, TYPE_SRV, Some(1232))).unwrap();
        assert!(edns.len() <= 1232);
        let (_, kept_edns) = counts(&edns);
        assert!(kept_plain >= 10 && kept_edns > kept_plain && kept_edns < 100, "{kept_plain} {kept_edns}");
    }

    #[tokio::test]
    async fn serves_over_udp() {
        let directory = Directory::default();
        let service = service_name("web.test");
        directory.replace(HashMap::from([(service.clone(), vec![Target::of("127.0.0.1:8080".parse().unwrap())])]));
        let address = serve(directory.clone(), 0).await.unwrap();
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        socket.send_to(&query(&service, TYPE_SRV, None), address).await.unwrap();
        let mut buffer = [0u8; 1500];
        let len = tokio::time::timeout(Duration::from_secs(5), socket.recv(&mut buffer)).await.unwrap().unwrap();
        assert_eq!(counts(&buffer[..len]), (0, 1));
    }
}
