//! Rendering the route table into Caddy's JSON configuration.
//!
//! - One HTTPS server with one route for all hosts that reverse-proxies to
//!   the upstreams the agent's directory lists for the request's host (see
//!   [`super::dns`]), then a 404 for anything else. The configuration names hosts only, never
//!   instances, so a blue/green switch changes the directory and leaves
//!   Caddy's configuration (and its open connections) alone.
//! - One HTTP server that redirects known hosts to HTTPS and answers 404 to
//!   the rest.
//! - Certificates: Caddy's internal issuer for `localhost`, `*.localhost`,
//!   `*.test`, `*.internal`, `*.local` and IP addresses (works offline and
//!   in tests), on demand at a host's first TLS handshake, for hosts the
//!   agent permits. Every other host is served with the certificate the
//!   control plane obtained from the ACME CA for the whole cluster
//!   (`load_pem`); Caddy never orders one itself, so N ingress nodes do not
//!   make N orders. Until that certificate arrives, a public host's
//!   handshake fails.
//! - `/.well-known/acme-challenge/*` on the HTTP server goes to the agent's
//!   challenge responder (see [`super::acme`]) before any redirect.
//! - Access logs go, through a filter that deletes everything but host,
//!   status and duration, to the agent's unix socket.
//! - Proxied WebSocket and streaming connections are kept open for a while
//!   across reloads (`stream_close_delay`), so a route change does not cut
//!   them.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use cloudweb_protocol::HostCertificate;
use serde_json::{json, Value};

use super::caddy::admin_block;
use super::dns;

#[derive(Debug, Clone)]
pub struct Ports {
    pub http: u16,
    pub https: u16,
    /// The one address both servers listen on; all addresses when `None`.
    pub ip: Option<IpAddr>,
}

impl Ports {
    /// Caddy's listener address for `port`.
    fn listen(&self, port: u16) -> String {
        match self.ip {
            Some(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
            Some(ip) => format!("{ip}:{port}"),
            None => format!(":{port}"),
        }
    }
}

/// How long a proxied stream survives a configuration reload.
pub const STREAM_CLOSE_DELAY: &str = "10m";

/// Idle keep-alive connections Caddy keeps to each instance (its default
/// is 32). A new connection costs Caddy more than a whole proxied request:
/// the name's lookup in the agent's directory, then a connect (through
/// Docker's proxy on a published port); measured on 2 cores, about 200 us
/// of Caddy's CPU and 1 ms of latency. With more requests at once than
/// idle connections, each burst closed the surplus and dialed it again:
/// 64 concurrent requests to one instance cost 18% more of Caddy's CPU
/// per request with 32 than with this.
pub const IDLE_CONNECTIONS_PER_INSTANCE: u32 = 256;

pub use cloudweb_protocol::certificates::internal_host;

/// Upstreams a proxy can dial: `host:port` with a valid port. Anything else
/// is dropped (and logged by the caller) rather than failing the whole load.
pub fn usable_upstream(address: &str) -> bool {
    cloudweb_protocol::validate::endpoint("upstream", address).is_ok()
}

/// The agent's loopback services Caddy calls.
#[derive(Debug, Clone, Copy)]
pub struct Local {
    /// The upstream directory (UDP DNS).
    pub resolver: SocketAddr,
    /// The on-demand TLS permission check (HTTP).
    pub permission: SocketAddr,
    /// The ACME HTTP-01 challenge responder (HTTP).
    pub challenges: SocketAddr,
}

/// Caddy's configuration for these hosts, with the control plane's ACME
/// certificates for the public ones.
pub fn render(
    hosts: &[String],
    certificates: &[HostCertificate],
    ports: &Ports,
    admin_socket: &Path,
    access_socket: &Path,
    local: Local,
) -> Value {
    let resolver = local.resolver;
    let mut https_routes = Vec::new();
    let mut http_routes = Vec::new();
    let mut internal = Vec::new();
    let mut public = Vec::new();
    let resolvers = json!({"addresses": [format!("udp/{resolver}")]});
    // One proxy for every host: the SRV name comes from the request's host,
    // so Caddy provisions one handler whatever the size of the table.
    let proxy = json!({
        "handler": "reverse_proxy",
        "dynamic_upstreams": {
            "source": "srv",
            "name": dns::SERVICE_PLACEHOLDER,
            "refresh": format!("{}ms", dns::REFRESH.as_millis()),
            // Should the directory stop answering (the agent restarts),
            // the last answer keeps serving.
            "grace_period": "5m",
            "resolver": resolvers,
            "dial_timeout": "2s",
        },
        // Upstream names (`4-127-0-0-1.a.cloudweb.`) resolve through the
        // same directory, at each new connection; kept-alive ones skip it.
        "transport": {
            "protocol": "http",
            "resolver": resolvers,
            "keep_alive": {"max_idle_conns_per_host": IDLE_CONNECTIONS_PER_INSTANCE},
        },
        "stream_close_delay": STREAM_CLOSE_DELAY,
        // A dial error (an instance that just stopped) is retried, with a
        // fresh upstream list, instead of failing the request.
        "load_balancing": {"selection_policy": {"policy": "round_robin"}, "try_duration": "3s", "try_interval": "100ms"},
    });
    if !hosts.is_empty() {
        // Challenges first: the CA's validation must not be redirected.
        http_routes.push(json!({
            "match": [{"host": hosts, "path": [format!("{}*", super::acme::CHALLENGE_PREFIX)]}],
            "handle": [{"handler": "reverse_proxy", "upstreams": [{"dial": local.challenges.to_string()}]}],
            "terminal": true,
        }));
        https_routes.push(json!({"match": [{"host": hosts}], "handle": [proxy], "terminal": true}));
        http_routes.push(json!({
            "match": [{"host": hosts}],
            "handle": [{
                "handler": "static_response",
                "status_code": 308,
                "headers": {"Location": [format!("https://{{http.request.host}}{}{{http.request.uri}}", if ports.https == 443 { String::new() } else { format!(":{}", ports.https) })]},
            }],
            "terminal": true,
        }));
    }
    for host in hosts {
        if internal_host(host) {
            internal.push(host.clone());
        } else {
            public.push(host.clone());
        }
    }
    let not_found = json!({"handle": [{"handler": "static_response", "status_code": 404, "body": "unknown host\n"}]});
    https_routes.push(not_found.clone());
    http_routes.push(not_found);

    // Certificates are obtained on demand, at a host's first handshake, and
    // only for hosts the agent's permission check knows. A reload then costs
    // nothing per host: with ten thousand hosts, managing every certificate
    // at load time took Caddy seconds on each route change.
    let mut policies = Vec::new();
    if !internal.is_empty() {
        policies.push(json!({"subjects": internal, "issuers": [{"module": "internal"}], "on_demand": true}));
    }
    // Public hosts: only the control plane's certificates, loaded here.
    let loaded: Vec<Value> = certificates
        .iter()
        .filter(|c| public.contains(&c.host))
        .map(|c| json!({"certificate": c.chain_pem, "key": c.key_pem, "tags": ["cloudweb-acme"]}))
        .collect();
    // Only host, status and duration reach the agent.
    let dropped = [
        "request>remote_ip", "request>remote_port", "request>client_ip", "request>proto", "request>method",
        "request>uri", "request>headers", "request>tls", "user_id", "size", "bytes_read", "resp_headers", "msg", "logger", "level", "ts",
    ];
    let fields: serde_json::Map<String, Value> = dropped.iter().map(|f| (f.to_string(), json!({"filter": "delete"}))).collect();
    let mut config = admin_block(admin_socket);
    config["logging"] = json!({"logs": {
        "default": {"level": "WARN"},
        "cloudweb_access": {
            "writer": {"output": "net", "address": format!("unix/{}", access_socket.display()), "soft_start": true},
            "encoder": {"format": "filter", "wrap": {"format": "json"}, "fields": fields},
            "include": ["http.log.access.cloudweb"],
        },
    }});
    config["apps"] = json!({
        "http": {
            "http_port": ports.http,
            "https_port": ports.https,
            "servers": {
                "cloudweb_https": {
                    "listen": [ports.listen(ports.https)],
                    "routes": https_routes,
                    "automatic_https": {"disable_redirects": true, "skip_certificates": public},
                    "logs": {"default_logger_name": "cloudweb"},
                },
                "cloudweb_http": {
                    "listen": [ports.listen(ports.http)],
                    "routes": http_routes,
                    "automatic_https": {"disable": true},
                    "logs": {"default_logger_name": "cloudweb"},
                },
            },
        },
        "tls": {
            "certificates": {"load_pem": loaded},
            "automation": {
                "policies": policies,
                "on_demand": {"permission": {"module": "http", "endpoint": format!("http://{}/", local.permission)}},
            },
        },
        // The internal CA's root stays in Caddy's storage; the agent never
        // touches the machine's trust store.
        "pki": {"certificate_authorities": {"local": {"install_trust": false}}},
    });
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_routes_with_fallbacks() {
        let hosts = ["web.test".to_string(), "empty.test".to_string(), "www.example.com".to_string()];
        let local = Local {
            resolver: "127.0.0.1:5353".parse().unwrap(),
            permission: "127.0.0.1:7000".parse().unwrap(),
            challenges: "127.0.0.1:7001".parse().unwrap(),
        };
        let ports = Ports { http: 8080, https: 8443, ip: None };
        let certificate = HostCertificate { host: "www.example.com".into(), chain_pem: "CHAIN".into(), key_pem: "KEY".into(), not_after_ms: 0 };
        let stale = HostCertificate { host: "gone.example.com".into(), ..certificate.clone() };
        let config = render(&hosts, &[certificate, stale], &ports, Path::new("/run/a.sock"), Path::new("/run/l.sock"), local);
        let routes = &config["apps"]["http"]["servers"]["cloudweb_https"]["routes"];
        assert_eq!(routes[0]["match"][0]["host"], json!(hosts), "one route for every host");
        let proxy = &routes[0]["handle"][0];
        assert_eq!(proxy["dynamic_upstreams"]["name"], dns::SERVICE_PLACEHOLDER);
        assert_eq!(proxy["dynamic_upstreams"]["resolver"]["addresses"], json!(["udp/127.0.0.1:5353"]));
        assert_eq!(proxy["transport"]["resolver"]["addresses"], json!(["udp/127.0.0.1:5353"]));
        assert_eq!(proxy["transport"]["keep_alive"]["max_idle_conns_per_host"], IDLE_CONNECTIONS_PER_INSTANCE, "connections to instances are kept alive");
        assert!(proxy.get("upstreams").is_none(), "no instance address in the configuration");
        assert_eq!(proxy["stream_close_delay"], STREAM_CLOSE_DELAY);
        assert_eq!(routes[1]["handle"][0]["status_code"], 404, "unknown hosts get a 404");
        let empty = render(&[], &[], &ports, Path::new("/run/a.sock"), Path::new("/run/l.sock"), local);
        assert_eq!(empty["apps"]["http"]["servers"]["cloudweb_https"]["routes"][0]["handle"][0]["status_code"], 404);
        let policies = &config["apps"]["tls"]["automation"]["policies"];
        assert_eq!(policies[0]["subjects"], json!(["web.test", "empty.test"]));
        assert_eq!(policies[0]["issuers"][0]["module"], "internal");
        assert_eq!(policies.as_array().unwrap().len(), 1, "no ACME policy: Caddy never orders for public hosts");
        assert_eq!(policies[0]["on_demand"], true);
        let loaded = &config["apps"]["tls"]["certificates"]["load_pem"];
        assert_eq!(loaded.as_array().unwrap().len(), 1, "only certificates of hosts in the table");
        assert_eq!(loaded[0]["certificate"], "CHAIN");
        assert_eq!(loaded[0]["key"], "KEY");
        assert_eq!(routes_of(&config, "cloudweb_https")[0]["match"][0]["host"], json!(hosts));
        assert_eq!(config["apps"]["http"]["servers"]["cloudweb_https"]["automatic_https"]["skip_certificates"], json!(["www.example.com"]));
        assert_eq!(config["apps"]["tls"]["automation"]["on_demand"]["permission"]["endpoint"], "http://127.0.0.1:7000/");
        assert_eq!(config["admin"]["listen"], "unix//run/a.sock");
        let challenge = &config["apps"]["http"]["servers"]["cloudweb_http"]["routes"][0];
        assert_eq!(challenge["match"][0]["path"], json!(["/.well-known/acme-challenge/*"]), "challenges before the redirect");
        assert_eq!(challenge["handle"][0]["upstreams"][0]["dial"], "127.0.0.1:7001");
        let redirect = &config["apps"]["http"]["servers"]["cloudweb_http"]["routes"][1]["handle"][0];
        assert_eq!(redirect["headers"]["Location"][0], "https://{http.request.host}:8443{http.request.uri}");
        let filter = &config["logging"]["logs"]["cloudweb_access"]["encoder"]["fields"];
        assert!(filter.get("request>uri").is_some() && filter.get("request>remote_ip").is_some());
        assert_eq!(config["apps"]["http"]["servers"]["cloudweb_http"]["listen"], json!([":8080"]));
        let bound = render(&hosts, &[], &Ports { ip: Some("127.0.0.2".parse().unwrap()), ..ports.clone() }, Path::new("/a"), Path::new("/l"), local);
        assert_eq!(bound["apps"]["http"]["servers"]["cloudweb_https"]["listen"], json!(["127.0.0.2:8443"]));
        let v6 = render(&hosts, &[], &Ports { ip: Some("::1".parse().unwrap()), ..ports }, Path::new("/a"), Path::new("/l"), local);
        assert_eq!(v6["apps"]["http"]["servers"]["cloudweb_http"]["listen"], json!(["[::1]:8080"]));
    }

    fn routes_of<'a>(config: &'a Value, server: &str) -> &'a Value {
        &config["apps"]["http"]["servers"][server]["routes"]
    }
}
