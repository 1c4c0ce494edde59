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
//!
//! Packets are read and written with `hickory-proto`; what is ours is the
//! policy on top: which names exist, the stricter question check, and how
//! an answer is cut to the client's buffer (`records_within`).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_proto::op::{Header, Message, MessageType, Metadata, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SRV};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, BinEncodable, BinEncoder};
use tokio::net::UdpSocket;

/// How long Caddy may use an answer before asking again. A switch counts as
/// applied only once this has passed after the directory changed.
pub const REFRESH: Duration = Duration::from_millis(250);

const HOSTS: &str = "h.cloudweb.";
const ADDRESSES: &str = "a.cloudweb.";
/// Answers larger than the client's buffer are cut to whole records, never
/// truncated with TC: Caddy's resolver would retry over TCP on the same UDP
/// socket. 1232 bytes hold about 28 upstreams per host.
const PLAIN_UDP_SIZE: usize = 512;
/// The largest buffer we fill, whatever a client advertises.
const MAX_UDP_SIZE: usize = 4096;

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

/// Service name → targets.
type Zone = HashMap<String, Vec<Target>>;

/// The zone, swapped whole on every change.
#[derive(Clone, Default)]
pub struct Directory {
    zone: Arc<RwLock<Arc<Zone>>>,
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
        let mut decoder = BinDecoder::new(query);
        let header = Header::read(&mut decoder).ok()?;
        if header.metadata.message_type == MessageType::Response {
            return None; // a response, not a query
        }
        let reply = |rcode: ResponseCode, question: Option<&Query>, answers: &[Record]| {
            let mut metadata = Metadata::new(header.metadata.id, MessageType::Response, header.metadata.op_code);
            metadata.authoritative = true;
            metadata.recursion_desired = header.metadata.recursion_desired;
            metadata.recursion_available = true;
            metadata.response_code = rcode;
            let mut message = Message::response(metadata.id, metadata.op_code);
            message.metadata = metadata;
            message.queries.extend(question.cloned());
            message.answers.extend_from_slice(answers);
            message
        };
        let encode = |message: &Message| message.to_vec().ok();
        if header.metadata.op_code != OpCode::Query {
            return encode(&reply(ResponseCode::NotImp, None, &[]));
        }
        if header.counts.queries != 1 {
            return encode(&reply(ResponseCode::FormErr, None, &[]));
        }
        let Some((question, name)) = read_question(&mut decoder) else {
            return encode(&reply(ResponseCode::FormErr, None, &[]));
        };
        let limit = edns_size(&mut decoder, &header).unwrap_or(PLAIN_UDP_SIZE);

        let owner = question.name().clone();
        let in_class = question.query_class() == DNSClass::IN;
        let mut answers = Vec::new();
        let zone = self.current();
        if let Some(targets) = zone.get(&name) {
            if question.query_type() == RecordType::SRV && in_class {
                for target in targets {
                    // Targets come from `Target::of`, whose names always parse; a
                    // hand-made one that does not is left out rather than sent broken.
                    let Ok(target_name) = Name::from_ascii(&target.name) else { continue };
                    let srv = SRV::new(10, 10, target.port, target_name);
                    answers.push(answer_record(&owner, RData::SRV(srv)));
                }
            }
        } else if let Some(ip) = parse_address_name(&name) {
            match (ip, question.query_type()) {
                (IpAddr::V4(v4), RecordType::A) if in_class => answers.push(answer_record(&owner, RData::A(A(v4)))),
                (IpAddr::V6(v6), RecordType::AAAA) if in_class => {
                    answers.push(answer_record(&owner, RData::AAAA(AAAA(v6))))
                }
                _ => {}
            }
        } else {
            return encode(&reply(ResponseCode::NXDomain, Some(&question), &[]));
        }
        let mut message = reply(ResponseCode::NoError, Some(&question), &answers);
        message.answers.truncate(records_within(&message, limit)?);
        encode(&message)
    }
}

/// Reads the question, and its name lowercased with a trailing dot. Stricter
/// than the wire format: a compression pointer has no place in a question,
/// and labels hold only letters, digits, `-` and `_` (all our names do).
fn read_question(decoder: &mut BinDecoder<'_>) -> Option<(Query, String)> {
    let start = decoder.index();
    let question = Query::read(decoder).ok()?;
    let mut name = String::new();
    let mut wire_length = 1; // the root label
    for label in question.name().iter() {
        if !label.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_') {
            return None;
        }
        name.push_str(&String::from_utf8_lossy(label).to_ascii_lowercase());
        name.push('.');
        wire_length += 1 + label.len();
    }
    // TYPE and CLASS follow the name; fewer bytes read means a pointer.
    if decoder.index() - start != wire_length + 4 {
        return None;
    }
    if name.is_empty() {
        name.push('.');
    }
    Some((question, name))
}

/// The UDP payload size the client's EDNS OPT record asks for (RFC 6891),
/// bounded to what we serve; `None` without one or when the sections after
/// the question do not parse (the answer then fits plain DNS).
fn edns_size(decoder: &mut BinDecoder<'_>, header: &Header) -> Option<usize> {
    let counts = header.counts;
    let op_code = header.metadata.op_code;
    Message::read_records(decoder, counts.answers as usize, false, op_code).ok()?;
    Message::read_records(decoder, counts.authorities as usize, false, op_code).ok()?;
    let (_, edns, _) = Message::read_records(decoder, counts.additionals as usize, true, op_code).ok()?;
    Some(usize::from(edns?.max_payload()).clamp(PLAIN_UDP_SIZE, MAX_UDP_SIZE))
}

/// An answer record for the question's own name (encoded as a pointer to
/// it). TTL 0: Caddy caches by its own refresh.
fn answer_record(owner: &Name, data: RData) -> Record {
    Record::from_rdata(owner.clone(), 0, data)
}

/// How many of the message's answers fit in `limit` bytes. Our own rule on
/// purpose: hickory, asked to stay within a size, sets TC on what it cuts,
/// and Caddy's resolver answers TC by retrying over TCP on the same UDP
/// socket. So the records are measured here, encoded by hickory after the
/// header and question exactly as in the reply (names compressed against the
/// question), and the reply keeps the whole ones that fit, without TC.
fn records_within(message: &Message, limit: usize) -> Option<usize> {
    let mut head = message.clone();
    head.answers.clear();
    let mut buffer = Vec::with_capacity(limit);
    let mut encoder = BinEncoder::new(&mut buffer);
    head.emit(&mut encoder).ok()?;
    let mut kept = 0;
    for record in &message.answers {
        record.emit(&mut encoder).ok()?;
        if encoder.len() > limit {
            break;
        }
        kept += 1;
    }
    Some(kept)
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
    use hickory_proto::op::Edns;

    use super::*;

    const TYPE_A: RecordType = RecordType::A;
    const TYPE_AAAA: RecordType = RecordType::AAAA;
    const TYPE_SRV: RecordType = RecordType::SRV;
    const RCODE_FORMERR: u16 = 1;
    const RCODE_NXDOMAIN: u16 = 3;
    const RCODE_NOTIMP: u16 = 4;

    /// A query as a stub resolver sends it: id 0x1234, RD set, one question
    /// (the first label's length at offset 12), EDNS only when asked.
    fn query(name: &str, qtype: RecordType, edns: Option<u16>) -> Vec<u8> {
        let mut message = Message::query();
        message.metadata.id = 0x1234;
        message.metadata.recursion_desired = true;
        message.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        if let Some(size) = edns {
            let mut opt = Edns::new();
            opt.set_max_payload(size);
            message.set_edns(opt);
        }
        message.to_vec().unwrap()
    }

    /// The reply's RCODE and answer count, read from the header; the reply
    /// must also decode as a whole.
    fn counts(reply: &[u8]) -> (u16, u16) {
        Message::from_vec(reply).expect("the reply decodes");
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
