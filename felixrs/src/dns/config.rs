//! The values of the DNS flags.

use std::net::{IpAddr, SocketAddr};

/// The default DNS port of a trusted server given without one.
pub const DNS_PORT: u16 = 53;
/// `--dns-queue-num`'s default (the renderer's).
pub const DEFAULT_QUEUE_NUM: u16 = iptables::render::DEFAULT_DNS_QUEUE_NUM;
/// `--dns-max-learned`'s default.
pub const DEFAULT_MAX_LEARNED: usize = 100_000;

/// Parses one `--dns-trusted-servers` item: `IP`, `IP:PORT`, `[IPv6]:PORT` or `[IPv6]` (port 53
/// when absent).
pub fn parse_trusted_server(s: &str) -> Result<SocketAddr, String> {
    let t = s.trim();
    if let Ok(sa) = t.parse::<SocketAddr>() {
        if sa.port() == 0 {
            return Err(format!("trusted DNS server {s:?}: port 0"));
        }
        return Ok(sa);
    }
    let bare = t
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(t);
    bare.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, DNS_PORT))
        .map_err(|_| {
            format!("invalid trusted DNS server {s:?}: expected IP, IP:PORT or [IPv6]:PORT")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_with_and_without_ports() {
        for (s, want) in [
            ("10.96.0.10", "10.96.0.10:53"),
            ("10.96.0.10:5353", "10.96.0.10:5353"),
            ("fd00::10", "[fd00::10]:53"),
            ("[fd00::10]", "[fd00::10]:53"),
            ("[fd00::10]:54", "[fd00::10]:54"),
        ] {
            assert_eq!(
                parse_trusted_server(s).unwrap(),
                want.parse().unwrap(),
                "{s}"
            );
        }
        for bad in ["", "dns.local", "10.0.0.1:0", "10.0.0.1:99999", "[fd00::1"] {
            let e = parse_trusted_server(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }
}
