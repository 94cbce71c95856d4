//! Hand-built desired states with representative Calico-style chains, hooks and sets, for tests
//! and benchmarks that do not go through the renderer.

#![allow(dead_code)]

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha224};

use iptables::desired::{
    DesiredRule, DesiredState, DesiredTable, HookPosition, HookRule, IpSetKind, IpSetMember,
    IpSetSpec, IpVersion, TableName,
};

/// Felix's chained rule hashes (felix-reference §6.3) over the chain name and the rule bodies.
pub fn mk_rules(chain: &str, bodies: &[&str]) -> Vec<DesiredRule> {
    let mut h = Sha224::digest(chain.as_bytes());
    bodies
        .iter()
        .map(|body| {
            let mut d = Sha224::new();
            d.update(h);
            d.update(format!("-A {chain} HASH {body}").as_bytes());
            h = d.finalize();
            let mut id = URL_SAFE_NO_PAD.encode(h);
            id.truncate(16);
            DesiredRule::new(id, *body)
        })
        .collect()
}

pub fn mk_hook(chain: &str, body: &str, position: HookPosition) -> HookRule {
    let hash_chain = match position {
        HookPosition::Top => chain.to_string(),
        HookPosition::Append => format!("{chain}*appends*"),
    };
    HookRule {
        kernel_chain: chain.to_string(),
        rule: mk_rules(&hash_chain, &[body]).remove(0),
        position,
    }
}

pub fn mk_net(s: &str) -> IpSetMember {
    IpSetMember::Net(s.parse().unwrap())
}

pub const SET_WEB: &str = "cali40s:web-pods";
pub const SET_DB: &str = "cali40s:db-pods";

/// A small but representative state: filter hooks at the top of INPUT/FORWARD/OUTPUT and the
/// two appended FORWARD rules, a dispatch chain, a per-endpoint chain with a tier, a policy chain
/// matching two IP sets, a profile; raw PREROUTING and nat POSTROUTING hooks.
pub fn mk_state() -> DesiredState {
    let mut s = DesiredState::new(IpVersion::V4);
    let mut filter = DesiredTable::default();
    let chains: &[(&str, &[&str])] = &[
        (
            "cali-INPUT",
            &[
                "-i cali+ -g cali-wl-to-host",
                "-m mark --mark 0x10000/0x10000 -j ACCEPT",
            ],
        ),
        (
            "cali-wl-to-host",
            &[
                "-j cali-from-wl-dispatch",
                "-m comment --comment \"Configured DefaultEndpointToHostAction\" -j ACCEPT",
            ],
        ),
        (
            "cali-FORWARD",
            &[
                "-m mark --mark 0x0/0x10000 -j MARK --set-xmark 0x0/0xe0000",
                "-i cali+ -j cali-from-wl-dispatch",
                "-o cali+ -j cali-to-wl-dispatch",
            ],
        ),
        (
            "cali-OUTPUT",
            &[
                "-m mark --mark 0x10000/0x10000 -j ACCEPT",
                "-o cali+ -j RETURN",
            ],
        ),
        (
            "cali-from-wl-dispatch",
            &[
                "-i calia1b2c3d4e5f -g cali-fw-calia1b2c3d4e5f",
                "-m comment --comment \"Unknown interface\" -j DROP",
            ],
        ),
        (
            "cali-to-wl-dispatch",
            &[
                "-o calia1b2c3d4e5f -g cali-tw-calia1b2c3d4e5f",
                "-m comment --comment \"Unknown interface\" -j DROP",
            ],
        ),
        (
            "cali-fw-calia1b2c3d4e5f",
            &[
                "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-m conntrack --ctstate INVALID -j DROP",
                "-j MARK --set-xmark 0x0/0x30000",
                "-j cali-pro-kns.default",
                "-m mark --mark 0x10000/0x10000 -j RETURN",
                "-m comment --comment \"Drop if no profiles matched\" -j DROP",
            ],
        ),
        (
            "cali-tw-calia1b2c3d4e5f",
            &[
                "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-m conntrack --ctstate INVALID -j DROP",
                "-j MARK --set-xmark 0x0/0x30000",
                "-m comment --comment \"Start of tier default\" -j MARK --set-xmark 0x0/0x20000",
                "-m mark --mark 0x0/0x20000 -j cali-pi-_web-allow-db",
                "-m mark --mark 0x10000/0x10000 -j RETURN",
                "-m mark --mark 0x0/0x20000 -m comment --comment \"End of tier default. Drop if no policies passed packet\" -j DROP",
            ],
        ),
        (
            "cali-pi-_web-allow-db",
            &[
                "-p tcp -m set --match-set cali40s:web-pods src -m set --match-set cali40s:db-pods dst -m multiport --dports 5432 -j MARK --set-xmark 0x10000/0x10000",
                "-m mark --mark 0x10000/0x10000 -j RETURN",
            ],
        ),
        (
            "cali-pro-kns.default",
            &[
                "-j MARK --set-xmark 0x10000/0x10000",
                "-m mark --mark 0x10000/0x10000 -j RETURN",
            ],
        ),
    ];
    for (name, bodies) in chains {
        filter
            .chains
            .insert(name.to_string(), mk_rules(name, bodies));
    }
    filter.hooks = vec![
        mk_hook("INPUT", "-j cali-INPUT", HookPosition::Top),
        mk_hook("FORWARD", "-j cali-FORWARD", HookPosition::Top),
        mk_hook("OUTPUT", "-j cali-OUTPUT", HookPosition::Top),
        mk_hook(
            "FORWARD",
            "-m comment --comment \"Policy explicitly accepted packet.\" -m mark --mark 0x10000/0x10000 -j ACCEPT",
            HookPosition::Append,
        ),
        mk_hook(
            "FORWARD",
            "-j MARK --set-xmark 0x10000/0x10000",
            HookPosition::Append,
        ),
    ];
    s.tables.insert(TableName::Filter, filter);

    let mut raw = DesiredTable::default();
    raw.chains.insert(
        "cali-PREROUTING".into(),
        mk_rules(
            "cali-PREROUTING",
            &[
                "-j MARK --set-xmark 0x0/0xf0000",
                "-i cali+ -j MARK --set-xmark 0x40000/0x40000",
            ],
        ),
    );
    raw.hooks = vec![mk_hook(
        "PREROUTING",
        "-j cali-PREROUTING",
        HookPosition::Top,
    )];
    s.tables.insert(TableName::Raw, raw);

    let mut nat = DesiredTable::default();
    nat.chains.insert(
        "cali-POSTROUTING".into(),
        mk_rules("cali-POSTROUTING", &["-j cali-nat-outgoing"]),
    );
    nat.chains.insert(
        "cali-nat-outgoing".into(),
        mk_rules("cali-nat-outgoing", &["-m set --match-set cali40s:web-pods src -m set ! --match-set cali40s:db-pods dst -j MASQUERADE"]),
    );
    nat.hooks = vec![mk_hook(
        "POSTROUTING",
        "-j cali-POSTROUTING",
        HookPosition::Append,
    )];
    s.tables.insert(TableName::Nat, nat);

    s.ip_sets.insert(
        SET_WEB.into(),
        IpSetSpec::new(
            IpSetKind::Net,
            [mk_net("10.65.0.1/32"), mk_net("10.65.0.2/32")],
        ),
    );
    s.ip_sets.insert(
        SET_DB.into(),
        IpSetSpec::new(IpSetKind::Net, [mk_net("10.65.1.0/24")]),
    );
    s
}
