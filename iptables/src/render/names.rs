//! Chain and IP set names (felix-reference §5).
//!
//! Invariants: every chain name returned here is at most [`MAX_CHAIN_NAME_LEN`] bytes and consists
//! only of `[A-Za-z0-9._:/-]`; every IP set name is at most [`MAX_IPSET_NAME_LEN`] bytes with no
//! whitespace or quote. Whatever a resource name contains, it can only reach a chain name through
//! the SHA-256 branch of [`length_limited_id`], so it cannot break out of its restore-text token.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use calc_graph::proto::{IpSetId, IpVersion, PolicyId, PolicyKind};
use ipnet::IpNet;
use sha2::{Digest, Sha224, Sha256};

use super::build::Rule;

/// `iptables.MaxChainNameLength`.
pub const MAX_CHAIN_NAME_LEN: usize = 28;
/// `MaxIPSetNameLength`.
pub const MAX_IPSET_NAME_LEN: usize = 31;

pub const POLICY_IN_PREFIX: &str = "cali-pi-";
pub const POLICY_OUT_PREFIX: &str = "cali-po-";
pub const PROFILE_IN_PREFIX: &str = "cali-pri-";
pub const PROFILE_OUT_PREFIX: &str = "cali-pro-";
pub const TO_WORKLOAD_PREFIX: &str = "cali-tw-";
pub const FROM_WORKLOAD_PREFIX: &str = "cali-fw-";
/// Shared (content-addressed) policy chains of endpoints, ingress (to the workload).
pub const SHARED_IN_PREFIX: &str = "cali-si-";
/// Shared (content-addressed) policy chains of endpoints, egress (from the workload).
pub const SHARED_OUT_PREFIX: &str = "cali-so-";
/// Characters of hash in a shared chain name (120 bits; `cali-si-` + 20 = 28, the limit).
const SHARED_HASH_LEN: usize = 20;

/// Characters a resource-derived chain-name suffix may keep verbatim. Anything else forces the
/// hashed form (Felix never sees such names because Calico validation rejects them).
fn is_safe_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._:/-".contains(c)
}

/// Felix's `GetLengthLimitedID(prefix, suffix, maxLen)`: `prefix+suffix` when it fits, otherwise
/// `prefix + "_" + base64url(SHA-256(suffix))` cut to `max_len`. A suffix with characters outside
/// the safe set is always hashed (a deliberate, documented extension).
pub fn length_limited_id(prefix: &str, suffix: &str, max_len: usize) -> String {
    let suffix = if suffix.is_empty() { "_" } else { suffix };
    let total = prefix.len() + suffix.len();
    let unsafe_chars = !suffix.chars().all(is_safe_name_char);
    if unsafe_chars || total > max_len || (total == max_len && suffix.starts_with('_')) {
        hashed_id(prefix, suffix, max_len)
    } else {
        format!("{prefix}{suffix}")
    }
}

/// `prefix + "_" + base64url(SHA-256(suffix))`, cut to `max_len` (the hashed branch of
/// [`length_limited_id`]).
pub fn hashed_id(prefix: &str, suffix: &str, max_len: usize) -> String {
    let hash = URL_SAFE_NO_PAD.encode(Sha256::digest(suffix.as_bytes()));
    let left = max_len.saturating_sub(prefix.len() + 1);
    format!("{prefix}_{}", &hash[..left.min(hash.len())])
}

/// The v3.32+ `PolicyID.ID()`: `np/<ns>/<name>` or `gnp/<name>`; the staged kinds (rendered
/// only in the staged view, never in the kernel) `snp/<ns>/<name>`, `sgnp/<name>`,
/// `sknp/<ns>/<name>`.
pub fn policy_chain_id(id: &PolicyId) -> String {
    let short = match id.kind {
        PolicyKind::NetworkPolicy => "np",
        PolicyKind::GlobalNetworkPolicy => "gnp",
        PolicyKind::StagedNetworkPolicy => "snp",
        PolicyKind::StagedGlobalNetworkPolicy => "sgnp",
        PolicyKind::StagedKubernetesNetworkPolicy => "sknp",
    };
    match &id.namespace {
        Some(ns) => format!("{short}/{ns}/{}", id.name),
        None => format!("{short}/{}", id.name),
    }
}

/// `cali-pi-<id>` (ingress) or `cali-po-<id>` (egress).
pub fn policy_chain_name(id: &PolicyId, ingress: bool) -> String {
    let prefix = if ingress {
        POLICY_IN_PREFIX
    } else {
        POLICY_OUT_PREFIX
    };
    length_limited_id(prefix, &policy_chain_id(id), MAX_CHAIN_NAME_LEN)
}

/// `cali-pri-<profile>` (ingress) or `cali-pro-<profile>` (egress).
pub fn profile_chain_name(profile: &str, ingress: bool) -> String {
    let prefix = if ingress {
        PROFILE_IN_PREFIX
    } else {
        PROFILE_OUT_PREFIX
    };
    length_limited_id(prefix, profile, MAX_CHAIN_NAME_LEN)
}

/// `cali-tw-<iface>` (to the workload, ingress policy) or `cali-fw-<iface>` (from it, egress).
pub fn endpoint_chain_name(iface: &str, ingress: bool) -> String {
    let prefix = if ingress {
        TO_WORKLOAD_PREFIX
    } else {
        FROM_WORKLOAD_PREFIX
    };
    length_limited_id(prefix, iface, MAX_CHAIN_NAME_LEN)
}

/// `cali-si-<20>` (ingress) or `cali-so-<20>` (egress): the first 20 characters of
/// base64url(SHA-224) over the direction and each rule's Felix text, one per line. Equal rules
/// give the same name (endpoints with the same tiers, policies and profiles share the chain);
/// different rules give different names but for a 120-bit collision.
pub fn shared_chain_name(rules: &[Rule], ingress: bool) -> String {
    let (prefix, dir) = if ingress {
        (SHARED_IN_PREFIX, "ingress")
    } else {
        (SHARED_OUT_PREFIX, "egress")
    };
    let mut h = Sha224::new();
    h.update(dir.as_bytes());
    h.update(b"\n");
    for r in rules {
        h.update(r.felix_text().as_bytes());
        h.update(b"\n");
    }
    let hash = URL_SAFE_NO_PAD.encode(h.finalize());
    format!("{prefix}{}", &hash[..SHARED_HASH_LEN])
}

/// Whether a chain name is one of the shared endpoint policy chains.
pub fn is_shared_chain(name: &str) -> bool {
    name.starts_with(SHARED_IN_PREFIX) || name.starts_with(SHARED_OUT_PREFIX)
}

/// Whether an interface name is usable verbatim in `--in-interface` / `--out-interface`: 1 to 15
/// bytes (IFNAMSIZ - 1) of `[A-Za-z0-9._-]`, and not ending in `+` (which would be a wildcard).
pub fn is_valid_interface_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

/// Whether an IP set id from the graph is safe to embed in a set name (`s:`/`n:` + base64url).
pub fn is_valid_ipset_id(id: &IpSetId) -> bool {
    !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ":_-.".contains(c))
}

/// Id prefix of the content-addressed `hash:net` sets of rules' CIDR lists (shared layout).
pub const NET_SET_ID_PREFIX: &str = "c:";
/// Characters of hash in a net set id: `cali40` + `c:` + 23 = 31, the limit (138 bits).
const NET_SET_HASH_LEN: usize = MAX_IPSET_NAME_LEN - "cali40".len() - NET_SET_ID_PREFIX.len();

/// The nets as a net set holds them: network bits only (as the kernel stores them), sorted,
/// without duplicates. Equal lists (in any order, with any host bits) give equal sets.
pub fn canonical_nets(nets: &[IpNet]) -> Vec<IpNet> {
    let mut out: Vec<IpNet> = nets.iter().map(IpNet::trunc).collect();
    out.sort();
    out.dedup();
    out
}

/// The id of the `hash:net` set holding exactly `nets` (already [`canonical_nets`]) in family
/// `version`: `c:` + the first 23 characters of base64url(SHA-256) over the family and the nets,
/// one per line. Only addresses go in: no name, label or comment can reach it, and it always
/// passes [`is_valid_ipset_id`] and fits [`ipset_name`] uncut.
pub fn net_set_id(version: IpVersion, nets: &[IpNet]) -> String {
    let mut h = Sha256::new();
    h.update(if version == IpVersion::V6 {
        b"v6\n"
    } else {
        b"v4\n"
    });
    for n in nets {
        h.update(n.to_string().as_bytes());
        h.update(b"\n");
    }
    let hash = URL_SAFE_NO_PAD.encode(h.finalize());
    format!("{NET_SET_ID_PREFIX}{}", &hash[..NET_SET_HASH_LEN])
}

/// The kernel set name: `cali40<id>` / `cali60<id>` cut to 31 characters.
pub fn ipset_name(version: IpVersion, id: &str) -> String {
    let mut name = match version {
        IpVersion::V4 => format!("cali40{id}"),
        IpVersion::V6 => format!("cali60{id}"),
    };
    // Ids are validated ASCII, so truncation is on a char boundary.
    name.truncate(MAX_IPSET_NAME_LEN);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_np(ns: &str, name: &str) -> PolicyId {
        PolicyId {
            kind: PolicyKind::NetworkPolicy,
            tier: "default".into(),
            namespace: Some(ns.into()),
            name: name.into(),
        }
    }

    #[test]
    fn felix_name_vectors() {
        // felix-reference §2.4 / §5.1.
        assert_eq!(
            length_limited_id("cali-pi-", "knp/default/allow-foo", 28),
            "cali-pi-_e3--Ll7YEaaa5wzNbuT"
        );
        assert_eq!(
            profile_chain_name("ksa.kube-system.coredns", false),
            "cali-pro-_u2Tn2rSoAPffvE7JO6"
        );
        assert_eq!(
            profile_chain_name("ksa.default.default", true),
            "cali-pri-ksa.default.default"
        );
        assert_eq!(
            profile_chain_name("kns.default", true),
            "cali-pri-kns.default"
        );
        assert_eq!(
            endpoint_chain_name("calic440f455693", true),
            "cali-tw-calic440f455693"
        );
        assert_eq!(policy_chain_name(&mk_np("a", "b"), true), "cali-pi-np/a/b");
        assert_eq!(length_limited_id("cali-pi-", "", 28), "cali-pi-_");
    }

    #[test]
    fn hostile_names_are_hashed_and_bounded() {
        for name in ["a b", "x\"y", "-j ACCEPT", "a\nb", &"n".repeat(300), "é"] {
            let chain = policy_chain_name(&mk_np("ns", name), true);
            assert!(chain.len() <= MAX_CHAIN_NAME_LEN, "{chain}");
            assert!(chain.starts_with("cali-pi-_"), "{chain}");
            assert!(chain.chars().all(is_safe_name_char), "{chain}");
        }
    }

    #[test]
    fn net_set_ids_are_content_addressed_and_fit() {
        let nets = |list: &[&str]| -> Vec<IpNet> {
            canonical_nets(&list.iter().map(|s| s.parse().unwrap()).collect::<Vec<_>>())
        };
        let a = nets(&["172.16.3.0/24", "10.3.0.0/16"]);
        // Order, duplicates and host bits do not change the set.
        assert_eq!(a, nets(&["10.3.7.1/16", "172.16.3.0/24", "10.3.0.0/16"]));
        let id = net_set_id(IpVersion::V4, &a);
        assert_eq!(id, net_set_id(IpVersion::V4, &a));
        assert!(id.starts_with(NET_SET_ID_PREFIX));
        assert!(is_valid_ipset_id(&id));
        for v in [IpVersion::V4, IpVersion::V6] {
            let name = ipset_name(v, &id);
            assert_eq!(name.len(), MAX_IPSET_NAME_LEN, "{name}");
            assert!(name.ends_with(&id), "{name} cut");
        }
        assert_ne!(id, net_set_id(IpVersion::V6, &a), "the family is hashed");
        assert_ne!(id, net_set_id(IpVersion::V4, &nets(&["10.3.0.0/16"])));
        assert_ne!(
            id,
            net_set_id(IpVersion::V4, &nets(&["10.3.0.0/16", "172.16.3.0/25"]))
        );
    }

    #[test]
    fn ipset_names_are_cut_to_31() {
        let id = "s:cttW8MqAIeVWez-m8dwR9b3Xyz0123456789abcd";
        assert_eq!(
            ipset_name(IpVersion::V4, id),
            "cali40s:cttW8MqAIeVWez-m8dwR9b3"
        );
        assert_eq!(ipset_name(IpVersion::V6, id).len(), 31);
        assert!(is_valid_ipset_id(&id.to_string()));
        assert!(!is_valid_ipset_id(&"s:a b".to_string()));
        assert!(is_valid_interface_name("calic440f455693"));
        assert!(!is_valid_interface_name("cali+"));
        assert!(!is_valid_interface_name("cali 1"));
        assert!(!is_valid_interface_name("calic440f4556931"));
    }
}
