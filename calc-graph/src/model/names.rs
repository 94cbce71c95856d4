//! Syntax checks for the strings of a resource: names, namespaces, tier names, label keys and
//! values, named ports, interface names, MAC addresses.
//!
//! Each check returns `Err(reason)` with a lower-case reason that quotes the offending value;
//! the validator prefixes the resource and the field path. These checks are also what keeps a
//! name or label from ever carrying `/` (it would change the etcd key), whitespace, quotes or
//! control characters (they would end up in iptables comments and IP set names).

/// Longest DNS-1123 subdomain (resource names, label key prefixes).
pub const MAX_NAME_LEN: usize = 253;
/// Longest DNS-1123 label (namespaces, tier names, label key names and values).
pub const MAX_LABEL_LEN: usize = 63;
/// Longest Linux interface name (IFNAMSIZ - 1).
pub const MAX_IFACE_LEN: usize = 15;

fn quote(s: &str) -> String {
    format!("{s:?}")
}

/// Rejects the characters that must never appear in any identifier.
fn check_no_bad_chars(s: &str) -> Result<(), String> {
    if s.contains('/') {
        return Err(format!("{} must not contain '/'", quote(s)));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{} must not contain whitespace or control characters",
            quote(s)
        ));
    }
    Ok(())
}

/// A DNS-1123 subdomain: lower-case alphanumerics, `-` and `.`, each `.`-separated part starting
/// and ending with an alphanumeric, at most 253 characters. Calico's rule for resource names.
pub fn validate_name(s: &str) -> Result<(), String> {
    dns_subdomain(s, "name")
}

/// Whether `s` is a well-formed DNS-1123 subdomain of at most `max` bytes, in one pass over the
/// bytes. Only a fast path: every string it accepts passes [`dns_subdomain`]'s checks, and
/// anything else goes through them to get the exact error message.
fn is_plain_subdomain(s: &str, max: usize) -> bool {
    let bytes = s.as_bytes();
    if bytes.is_empty() || bytes.len() > max {
        return false;
    }
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let mut prev = b'.'; // the start behaves like the start of a part
    for &c in bytes {
        let ok = match c {
            b'a'..=b'z' | b'0'..=b'9' => true,
            b'-' => prev != b'.', // a part must start with an alphanumeric
            b'.' => alnum(prev),  // a part must end with one (and not be empty)
            _ => false,
        };
        if !ok {
            return false;
        }
        prev = c;
    }
    alnum(prev)
}

fn dns_subdomain(s: &str, what: &str) -> Result<(), String> {
    if is_plain_subdomain(s, MAX_NAME_LEN) {
        return Ok(());
    }
    dns_subdomain_checks(s, what)
}

/// The checks of [`dns_subdomain`] one by one, each with its own message.
fn dns_subdomain_checks(s: &str, what: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err(format!("{what} must not be empty"));
    }
    check_no_bad_chars(s)?;
    if s.len() > MAX_NAME_LEN {
        return Err(format!(
            "{what} is {} characters long, more than {MAX_NAME_LEN}",
            s.len()
        ));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
    {
        return Err(format!(
            "{what} {} contains {c:?}: only lower-case letters, digits, '-' and '.' are allowed",
            quote(s)
        ));
    }
    if s.split('.').any(|part| !alnum_ends(part)) {
        return Err(format!(
            "{what} {}: each '.'-separated part must start and end with a lower-case letter or digit",
            quote(s)
        ));
    }
    Ok(())
}

fn alnum_ends(part: &str) -> bool {
    let ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    ok(part.chars().next()) && ok(part.chars().last())
}

/// A DNS-1123 label: lower-case alphanumerics and `-`, starting and ending with an alphanumeric,
/// at most 63 characters. The rule for namespaces.
pub fn validate_namespace(s: &str) -> Result<(), String> {
    dns_label(s, "namespace")
}

/// Tier names are DNS-1123 labels (no `.`: Calico once prefixed policy names with `<tier>.`).
pub fn validate_tier_name(s: &str) -> Result<(), String> {
    dns_label(s, "tier name")
}

fn dns_label(s: &str, what: &str) -> Result<(), String> {
    if !s.contains('.') && is_plain_subdomain(s, MAX_LABEL_LEN) {
        return Ok(());
    }
    dns_label_checks(s, what)
}

/// The checks of [`dns_label`] one by one, each with its own message.
fn dns_label_checks(s: &str, what: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err(format!("{what} must not be empty"));
    }
    check_no_bad_chars(s)?;
    if s.len() > MAX_LABEL_LEN {
        return Err(format!(
            "{what} is {} characters long, more than {MAX_LABEL_LEN}",
            s.len()
        ));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(format!(
            "{what} {} contains {c:?}: only lower-case letters, digits and '-' are allowed",
            quote(s)
        ));
    }
    if !alnum_ends(s) {
        return Err(format!(
            "{what} {} must start and end with a lower-case letter or digit",
            quote(s)
        ));
    }
    Ok(())
}

/// A NetworkPolicy (or StagedNetworkPolicy) name as Calico accepts it: a DNS label, optionally
/// with one `.`-separated prefix (`tier.name`), or `knp.default.<subdomain>` /
/// `ossg.default.<subdomain>` for policies converted from Kubernetes. At most 253 characters.
pub fn validate_network_policy_name(s: &str) -> Result<(), String> {
    validate_name(s)?;
    if let Some(rest) = s
        .strip_prefix("knp.default.")
        .or_else(|| s.strip_prefix("ossg.default."))
    {
        return dns_subdomain(rest, "name");
    }
    policy_labels(
        s,
        "a DNS label with at most one '.' (tier.name), or knp.default.<name>",
    )
}

/// Name prefixes of GlobalNetworkPolicies converted from the Kubernetes cluster-scoped policy kinds
/// (AdminNetworkPolicy, BaselineAdminNetworkPolicy, ClusterNetworkPolicy); what follows is the
/// Kubernetes object's name, a DNS subdomain (as `knp.default.` for NetworkPolicies).
pub const K8S_ADMIN_POLICY_PREFIXES: [&str; 3] = [
    "kanp.adminnetworkpolicy.",
    "kbanp.baselineadminnetworkpolicy.",
    "kcnp.",
];

/// A GlobalNetworkPolicy (or StagedGlobalNetworkPolicy) name: a DNS label, optionally with one
/// `.`-separated prefix, or one of [`K8S_ADMIN_POLICY_PREFIXES`] and a DNS subdomain.
pub fn validate_global_network_policy_name(s: &str) -> Result<(), String> {
    validate_name(s)?;
    if let Some(rest) = K8S_ADMIN_POLICY_PREFIXES
        .iter()
        .find_map(|p| s.strip_prefix(p))
    {
        return dns_subdomain(rest, "name");
    }
    policy_labels(
        s,
        "a DNS label with at most one '.' (tier.name), or kanp.adminnetworkpolicy.<name>, \
         kbanp.baselineadminnetworkpolicy.<name> or kcnp.<name>",
    )
}

fn policy_labels(s: &str, want: &str) -> Result<(), String> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() > 2 || parts.iter().any(|p| p.len() > MAX_LABEL_LEN) {
        return Err(format!("policy name {} must be {want}", quote(s)));
    }
    Ok(())
}

/// A Kubernetes label key: `[prefix/]name`, prefix a DNS-1123 subdomain, name 1-63 characters of
/// alphanumerics, `-`, `_` and `.` starting and ending with an alphanumeric.
pub fn validate_label_key(s: &str) -> Result<(), String> {
    let plain = match s.split_once('/') {
        Some((prefix, name)) => {
            is_plain_subdomain(prefix, MAX_NAME_LEN) && is_plain_qualified(name)
        }
        None => is_plain_qualified(s),
    };
    if plain {
        return Ok(());
    }
    label_key_checks(s)
}

/// The checks of [`validate_label_key`] one by one, each with its own message.
fn label_key_checks(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("label key must not be empty".to_string());
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "label key {} must not contain whitespace or control characters",
            quote(s)
        ));
    }
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(prefix) = prefix {
        dns_subdomain(prefix, "label key prefix")
            .map_err(|e| format!("label key {}: {e}", quote(s)))?;
    }
    if name.is_empty() {
        return Err(format!("label key {} has an empty name part", quote(s)));
    }
    if name.contains('/') {
        return Err(format!("label key {} has more than one '/'", quote(s)));
    }
    qualified_part(name, "label key", s)
}

/// A Kubernetes label value: empty, or 1-63 characters of alphanumerics, `-`, `_` and `.`
/// starting and ending with an alphanumeric.
pub fn validate_label_value(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Ok(());
    }
    qualified_part(s, "label value", s)
}

/// Whether `part` passes [`qualified_part`] (1-63 letters, digits, `-`, `_`, `.`, alphanumeric
/// at both ends), in one pass over the bytes: the fast path of label checks.
fn is_plain_qualified(part: &str) -> bool {
    let bytes = part.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) if bytes.len() <= MAX_LABEL_LEN => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

fn qualified_part(part: &str, what: &str, whole: &str) -> Result<(), String> {
    if is_plain_qualified(part) {
        return Ok(());
    }
    qualified_part_checks(part, what, whole)
}

/// The checks of [`qualified_part`] one by one, each with its own message.
fn qualified_part_checks(part: &str, what: &str, whole: &str) -> Result<(), String> {
    if part.len() > MAX_LABEL_LEN {
        return Err(format!(
            "{what} {} is longer than {MAX_LABEL_LEN} characters",
            quote(whole)
        ));
    }
    if let Some(c) = part
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "{what} {} contains {c:?}: only letters, digits, '-', '_' and '.' are allowed",
            quote(whole)
        ));
    }
    if !alnum_ends(part) {
        return Err(format!(
            "{what} {} must start and end with a letter or digit",
            quote(whole)
        ));
    }
    Ok(())
}

/// A named port (IANA service name, as Kubernetes container port names): 1-15 characters of
/// lower-case letters, digits and `-`, at least one letter, no leading, trailing or double `-`.
pub fn validate_named_port(s: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("named port {}: {why}", quote(s)));
    if s.is_empty() {
        return bad("must not be empty");
    }
    if s.len() > 15 {
        return bad("must be at most 15 characters");
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return bad("only lower-case letters, digits and '-' are allowed");
    }
    if !s.chars().any(|c| c.is_ascii_lowercase()) {
        return bad("must contain at least one letter");
    }
    if s.starts_with('-') || s.ends_with('-') || s.contains("--") {
        return bad("must not start or end with '-' or contain '--'");
    }
    Ok(())
}

/// A Linux interface name as Calico accepts it: 1-15 characters of letters, digits, `_`, `.`
/// and `-`, not `.` or `..`. (No `+`: it is the iptables interface wildcard.)
pub fn validate_interface_name(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("interface name must not be empty".to_string());
    }
    if s.len() > MAX_IFACE_LEN {
        return Err(format!(
            "interface name {} is {} characters long, more than {MAX_IFACE_LEN}",
            quote(s),
            s.len()
        ));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(format!(
            "interface name {} contains {c:?}: only letters, digits, '_', '.' and '-' are allowed",
            quote(s)
        ));
    }
    if s == "." || s == ".." {
        return Err(format!("interface name {} is not allowed", quote(s)));
    }
    Ok(())
}

/// A MAC address in one of the forms Go's `net.ParseMAC` accepts for 48- and 64-bit addresses:
/// `00:00:5e:00:53:01`, `00-00-5e-00-53-01`, `0000.5e00.5301` (and the 8-byte variants).
pub fn validate_mac(s: &str) -> Result<(), String> {
    let hex = |p: &str, n: usize| p.len() == n && p.chars().all(|c| c.is_ascii_hexdigit());
    let ok = if s.contains('.') {
        let parts: Vec<&str> = s.split('.').collect();
        matches!(parts.len(), 3 | 4) && parts.iter().all(|p| hex(p, 4))
    } else {
        let sep = if s.contains('-') { '-' } else { ':' };
        let parts: Vec<&str> = s.split(sep).collect();
        matches!(parts.len(), 6 | 8) && parts.iter().all(|p| hex(p, 2))
    };
    if ok {
        Ok(())
    } else {
        Err(format!("invalid MAC address {}", quote(s)))
    }
}

/// A container id: ASCII letters, digits and `-`, starting and ending with a letter or digit.
pub fn validate_container_id(s: &str) -> Result<(), String> {
    let ok = s.len() <= MAX_NAME_LEN
        && alnum_ends(s)
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "container id {} must be letters, digits and '-', starting and ending with a letter or digit",
            quote(s)
        ))
    }
}

/// A free-form identifier (container id, workload, endpoint, orchestrator): non-empty, at most
/// 253 characters, no `/`, whitespace or control characters.
pub fn validate_identifier(s: &str) -> Result<(), String> {
    if s.len() > MAX_NAME_LEN {
        return Err(format!(
            "{} is {} characters long, more than {MAX_NAME_LEN}",
            quote(s),
            s.len()
        ));
    }
    check_no_bad_chars(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The one-pass fast paths accept exactly the strings the step-by-step checks accept, so
        /// they change no verdict (and rejected strings still get the step-by-step message).
        #[test]
        fn fast_paths_accept_exactly_what_the_checks_accept(
            s in "[a-z0-9.\\-/_A-Z \n]{0,8}|[a-z0-9.\\-]{0,70}|[a-z]{60,260}"
        ) {
            prop_assert_eq!(
                is_plain_subdomain(&s, MAX_NAME_LEN),
                dns_subdomain_checks(&s, "name").is_ok()
            );
            prop_assert_eq!(
                !s.contains('.') && is_plain_subdomain(&s, MAX_LABEL_LEN),
                dns_label_checks(&s, "namespace").is_ok()
            );
            prop_assert_eq!(validate_label_key(&s), label_key_checks(&s));
        }

        /// Label keys with a prefix and label values: the fast paths agree with the checks.
        #[test]
        fn label_fast_paths_agree(
            prefix in "[a-z0-9.\\-]{0,12}|[a-z]{250,256}",
            name in "[a-zA-Z0-9._\\-/ ]{0,8}|[a-z]{60,66}",
        ) {
            let key = format!("{prefix}/{name}");
            prop_assert_eq!(validate_label_key(&key), label_key_checks(&key));
            prop_assert_eq!(
                is_plain_qualified(&name),
                qualified_part_checks(&name, "label value", &name).is_ok()
            );
        }
    }

    #[test]
    fn names() {
        for ok in [
            "web",
            "knp.default.allow-db",
            "kns.prod",
            "a",
            "0-0",
            "node--1-k8s-db--0-eth0",
        ] {
            validate_name(ok).unwrap();
        }
        let long = "a".repeat(254);
        for (bad, want) in [
            ("", "must not be empty"),
            ("a/b", "must not contain '/'"),
            ("a b", "whitespace"),
            ("a\nb", "whitespace or control"),
            ("a\u{7}b", "control"),
            ("Web", "contains 'W'"),
            ("a_b", "contains '_'"),
            ("-a", "must start and end"),
            ("a.", "must start and end"),
            ("a..b", "must start and end"),
            (long.as_str(), "254 characters long, more than 253"),
        ] {
            let err = validate_name(bad).unwrap_err();
            assert!(err.contains(want), "{bad:?}: {err}");
        }
    }

    #[test]
    fn policy_names_follow_calico() {
        for ok in [
            "web",
            "tier1.web",
            "knp.default.allow-db",
            "knp.default.a.b.c",
            "ossg.default.x",
        ] {
            validate_network_policy_name(ok).unwrap();
        }
        for bad in ["a.b.c", "knp.default.", "Web", "a/b"] {
            assert!(validate_network_policy_name(bad).is_err(), "{bad:?}");
        }
        validate_global_network_policy_name("security.allow-dns").unwrap();
        validate_global_network_policy_name("kanp.adminnetworkpolicy.a.b").unwrap();
        validate_global_network_policy_name("kbanp.baselineadminnetworkpolicy.default").unwrap();
        validate_global_network_policy_name("kcnp.x").unwrap();
        assert!(validate_global_network_policy_name("kcnp.").is_err());
        assert!(validate_global_network_policy_name("kanp.other.x").is_err());
        assert!(
            validate_global_network_policy_name("knp.default.x")
                .unwrap_err()
                .contains("at most one '.'")
        );
        validate_container_id("1337495556942031415926535").unwrap();
        validate_container_id("docker-abc").unwrap();
        assert!(validate_container_id("abc def").is_err());
        assert!(validate_container_id("-abc").is_err());
    }

    #[test]
    fn namespaces_and_tiers() {
        validate_namespace("kube-system").unwrap();
        validate_tier_name("kube-admin").unwrap();
        assert!(
            validate_namespace("a.b")
                .unwrap_err()
                .contains("contains '.'")
        );
        assert!(validate_tier_name("Net").is_err());
        assert!(
            validate_namespace(&"a".repeat(64))
                .unwrap_err()
                .contains("more than 63")
        );
    }

    #[test]
    fn labels() {
        for ok in [
            "app",
            "projectcalico.org/namespace",
            "pcns.projectcalico.org/name",
            "A_b.c-D",
        ] {
            validate_label_key(ok).unwrap();
        }
        for (bad, want) in [
            ("", "must not be empty"),
            ("/x", "label key prefix must not be empty"),
            ("a/", "empty name part"),
            ("a/b/c", "more than one '/'"),
            ("Foo.com/x", "contains 'F'"),
            ("a b", "whitespace"),
            ("_x", "must start and end"),
            ("x=y", "contains '='"),
        ] {
            let err = validate_label_key(bad).unwrap_err();
            assert!(err.contains(want), "{bad:?}: {err}");
        }
        validate_label_value("").unwrap();
        validate_label_value("v1.2_3-x").unwrap();
        assert!(
            validate_label_value("a'b")
                .unwrap_err()
                .contains("contains '\\''")
        );
        assert!(validate_label_value(&"v".repeat(64)).is_err());
    }

    #[test]
    fn named_ports_interfaces_macs() {
        validate_named_port("http-alt").unwrap();
        for bad in ["", "8080", "HTTP", "-http", "h--p", "a-very-long-port-name"] {
            assert!(validate_named_port(bad).is_err(), "{bad:?}");
        }
        validate_interface_name("cali0ef24b1a2b3").unwrap();
        validate_interface_name("eth0.100").unwrap();
        assert!(
            validate_interface_name("cali0ef24b1a2b3c")
                .unwrap_err()
                .contains("16 characters")
        );
        assert!(validate_interface_name("eth+").unwrap_err().contains("'+'"));
        assert!(validate_interface_name("a b").is_err());
        assert!(validate_interface_name("..").is_err());
        validate_mac("ca:fe:1d:52:bb:e9").unwrap();
        validate_mac("CA-FE-1D-52-BB-E9").unwrap();
        validate_mac("cafe.1d52.bbe9").unwrap();
        validate_mac("ca:fe:1d:52:bb:e9:00:01").unwrap();
        assert!(validate_mac("ca:fe:1d:52:bb:e9:00").is_err());
        assert!(validate_mac("ca:fe:1d:52:bb").is_err());
        assert!(validate_mac("ca:fe:1d:52:bb:zz").is_err());
        validate_identifier("abc123").unwrap();
        assert!(validate_identifier("a\tb").is_err());
    }
}
