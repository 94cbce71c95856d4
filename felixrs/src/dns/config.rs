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
pub fn parse_trusted_server(s: &str) -> Result<SocketAddr, TrustedServerError> {
    let t = s.trim();
    if let Ok(sa) = t.parse::<SocketAddr>() {
        if sa.port() == 0 {
            return Err(TrustedServerError::PortZero(s.to_string()));
        }
        return Ok(sa);
    }
    let bare = t
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(t);
    bare.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, DNS_PORT))
        .map_err(|_| TrustedServerError::Invalid(s.to_string()))
}

/// A `--dns-trusted-servers` item that is not a server address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustedServerError {
    #[error("trusted DNS server {0:?}: port 0")]
    PortZero(String),
    #[error("invalid trusted DNS server {0:?}: expected IP, IP:PORT or [IPv6]:PORT")]
    Invalid(String),
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
            let e = parse_trusted_server(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }
}
