//! The node's interfaces and their addresses, for host endpoints without `interfaceName`
//! (the renderer places them by `expectedIPs`: [`iptables::render::Renderer::set_host_interfaces`]).
//!
//! Read with `ip -j addr show` through the dataplane's runner (so in the agent's network
//! namespace), only while such an endpoint exists: with every apply, refresh and drift check,
//! so an address that moves is followed within the drift interval. One `ip` call costs a few
//! milliseconds on a node's handful of interfaces; a netlink subscription would be quicker to
//! notice but needs a crate the tree does not have (ARCHITECTURE.md, "Host endpoints").

use std::collections::BTreeMap;
use std::net::IpAddr;

use iptables::apply::Runner;
use serde::Deserialize;

#[derive(Deserialize)]
struct Link {
    ifname: String,
    #[serde(default)]
    addr_info: Vec<Addr>,
}

#[derive(Deserialize)]
struct Addr {
    local: Option<String>,
}

/// Parses `ip -j addr show`: interface → its addresses (an address `ip` prints that is not an
/// IP address is skipped).
pub fn parse(json: &[u8]) -> Result<BTreeMap<String, Vec<IpAddr>>, String> {
    let links: Vec<Link> =
        serde_json::from_slice(json).map_err(|e| format!("ip -j addr show: {e}"))?;
    Ok(links
        .into_iter()
        .map(|l| {
            let addrs = (l.addr_info.iter())
                .filter_map(|a| a.local.as_deref()?.parse().ok())
                .collect();
            (l.ifname, addrs)
        })
        .collect())
}

/// Reads the interfaces with `runner`.
pub fn read(runner: &dyn Runner) -> Result<BTreeMap<String, Vec<IpAddr>>, String> {
    let out = runner
        .run("ip", &["-j", "addr", "show"], None)
        .map_err(|e| format!("ip -j addr show: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ip -j addr show: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    parse(&out.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_interfaces_and_addresses_of_both_families() {
        let json = br#"[{"ifindex":1,"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8}]},
            {"ifindex":2,"ifname":"eth0","addr_info":[{"family":"inet","local":"10.0.0.5","prefixlen":24},
             {"family":"inet6","local":"fd00::5","prefixlen":64}]},
            {"ifindex":3,"ifname":"eth1"}]"#;
        let m = parse(json).unwrap();
        assert_eq!(
            m["eth0"],
            [
                "10.0.0.5".parse::<IpAddr>().unwrap(),
                "fd00::5".parse().unwrap()
            ]
        );
        assert!(m["eth1"].is_empty());
        assert_eq!(m.len(), 3);
        assert!(parse(b"not json").unwrap_err().contains("ip -j addr show"));
    }
}
