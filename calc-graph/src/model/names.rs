//! Syntax checks for the strings of a resource: names, namespaces, tier names, label keys and
//! values, named ports, interface names, MAC addresses.
//!
//! Each check returns a [`NameError`] naming what was checked (`namespace`, `label key`, ...) and
//! quoting the offending value; the validator prefixes the resource and the field path. These checks are also what keeps a
//! name or label from ever carrying `/` (it would change the etcd key), whitespace, quotes or
//! control characters (they would end up in iptables comments and IP set names).

/// Longest DNS-1123 subdomain (resource names, label key prefixes).
pub const MAX_NAME_LEN: usize = 253;
/// Longest DNS-1123 label (namespaces, tier names, label key names and values).
pub const MAX_LABEL_LEN: usize = 63;
/// Longest Linux interface name (IFNAMSIZ - 1).
pub const MAX_IFACE_LEN: usize = 15;

/// Why a name, label, port name, interface name or MAC address is not valid: `what` is the kind
/// of string checked (`name`, `namespace`, `label key`, ...), `value` the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{what} must not be empty")]
    Empty { what: &'static str },
    /// `/`, whitespace or control characters (`forbidden` says which), never allowed.
    #[error("{} must not contain {forbidden}", subject(what, Some(value)))]
    Forbidden {
        what: &'static str,
        value: String,
        forbidden: &'static str,
    },
    #[error("{} is {len} characters long, more than {max}", subject(what, value.as_ref()))]
    TooLong {
        what: &'static str,
        value: Option<String>,
        len: usize,
        max: usize,
    },
    #[error("{what} {value:?} is longer than {max} characters")]
    PartTooLong {
        what: &'static str,
        value: String,
        max: usize,
    },
    #[error("{what} {value:?} contains {found:?}: only {allowed} are allowed")]
    Char {
        what: &'static str,
        value: String,
        found: char,
        allowed: &'static str,
    },
    #[error("{what} {value:?} must start and end with {ends}")]
    Ends {
        what: &'static str,
        value: String,
        ends: &'static str,
    },
    #[error(
        "{what} {value:?}: each '.'-separated part must start and end with a lower-case letter or digit"
    )]
    PartEnds { what: &'static str, value: String },
    #[error("policy name {value:?} must be {want}")]
    PolicyName { value: String, want: &'static str },
    #[error("label key {key:?}: {prefix}")]
    LabelKeyPrefix { key: String, prefix: Box<NameError> },
    /// The name part of a label key is empty or holds a second `/` (`problem` says which).
    #[error("label key {key:?} has {problem}")]
    LabelKeyName { key: String, problem: &'static str },
    #[error("named port {value:?}: {rule}")]
    NamedPort { value: String, rule: &'static str },
    #[error("{what} {value:?} is not allowed")]
    Reserved { what: &'static str, value: String },
    #[error("invalid MAC address {value:?}")]
    Mac { value: String },
    #[error(
        "container id {value:?} must be letters, digits and '-', starting and ending with a letter or digit"
    )]
    ContainerId { value: String },
}

/// `what "value"`, either part left out when absent.
fn subject(what: &str, value: Option<&String>) -> String {
    match (what, value) {
        ("", Some(v)) => format!("{v:?}"),
        (w, Some(v)) => format!("{w} {v:?}"),
        (w, None) => w.to_string(),
    }
}

/// Rejects the characters that must never appear in any identifier.
fn check_no_bad_chars(s: &str) -> Result<(), NameError> {
    let forbidden = if s.contains('/') {
        "'/'"
    } else if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        "whitespace or control characters"
    } else {
        return Ok(());
    };
    Err(NameError::Forbidden {
        what: "",
        value: s.to_string(),
        forbidden,
    })
}

/// A DNS-1123 subdomain: lower-case alphanumerics, `-` and `.`, each `.`-separated part starting
/// and ending with an alphanumeric, at most 253 characters. Calico's rule for resource names.
pub fn validate_name(s: &str) -> Result<(), NameError> {
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

fn dns_subdomain(s: &str, what: &'static str) -> Result<(), NameError> {
    if is_plain_subdomain(s, MAX_NAME_LEN) {
        return Ok(());
    }
    dns_subdomain_checks(s, what)
}

/// The checks of [`dns_subdomain`] one by one, each with its own message.
fn dns_subdomain_checks(s: &str, what: &'static str) -> Result<(), NameError> {
    common_checks(
        s,
        what,
        MAX_NAME_LEN,
        "lower-case letters, digits, '-' and '.'",
        |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.',
    )?;
    if s.split('.').any(|part| !alnum_ends(part)) {
        return Err(NameError::PartEnds {
            what,
            value: s.to_string(),
        });
    }
    Ok(())
}

/// Not empty, none of [`check_no_bad_chars`], at most `max` bytes, only characters `ok` takes
/// (`allowed` names them): what DNS subdomains and labels share.
fn common_checks(
    s: &str,
    what: &'static str,
    max: usize,
    allowed: &'static str,
    ok: impl Fn(char) -> bool,
) -> Result<(), NameError> {
    if s.is_empty() {
        return Err(NameError::Empty { what });
    }
    check_no_bad_chars(s)?;
    if s.len() > max {
        return Err(NameError::TooLong {
            what,
            value: None,
            len: s.len(),
            max,
        });
    }
    bad_char(s, what, s, allowed, ok)
}

/// The first character of `part` that `ok` refuses, reported against `whole`.
fn bad_char(
    part: &str,
    what: &'static str,
    whole: &str,
    allowed: &'static str,
    ok: impl Fn(char) -> bool,
) -> Result<(), NameError> {
    match part.chars().find(|c| !ok(*c)) {
        Some(found) => Err(NameError::Char {
            what,
            value: whole.to_string(),
            found,
            allowed,
        }),
        None => Ok(()),
    }
}

fn ends(part: &str, what: &'static str, whole: &str, ends: &'static str) -> Result<(), NameError> {
    if alnum_ends(part) {
        Ok(())
    } else {
        Err(NameError::Ends {
            what,
            value: whole.to_string(),
            ends,
        })
    }
}

fn alnum_ends(part: &str) -> bool {
    let ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    ok(part.chars().next()) && ok(part.chars().last())
}

/// A DNS-1123 label: lower-case alphanumerics and `-`, starting and ending with an alphanumeric,
/// at most 63 characters. The rule for namespaces.
pub fn validate_namespace(s: &str) -> Result<(), NameError> {
    dns_label(s, "namespace")
}

/// Tier names are DNS-1123 labels (no `.`: Calico once prefixed policy names with `<tier>.`).
pub fn validate_tier_name(s: &str) -> Result<(), NameError> {
    dns_label(s, "tier name")
}

fn dns_label(s: &str, what: &'static str) -> Result<(), NameError> {
    if !s.contains('.') && is_plain_subdomain(s, MAX_LABEL_LEN) {
        return Ok(());
    }
    dns_label_checks(s, what)
}

/// The checks of [`dns_label`] one by one, each with its own message.
fn dns_label_checks(s: &str, what: &'static str) -> Result<(), NameError> {
    common_checks(
        s,
        what,
        MAX_LABEL_LEN,
        "lower-case letters, digits and '-'",
        |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-',
    )?;
    ends(s, what, s, "a lower-case letter or digit")
}

/// A NetworkPolicy (or StagedNetworkPolicy) name as Calico accepts it: a DNS label, optionally
/// with one `.`-separated prefix (`tier.name`), or `knp.default.<subdomain>` /
/// `ossg.default.<subdomain>` for policies converted from Kubernetes. At most 253 characters.
pub fn validate_network_policy_name(s: &str) -> Result<(), NameError> {
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
pub fn validate_global_network_policy_name(s: &str) -> Result<(), NameError> {
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

fn policy_labels(s: &str, want: &'static str) -> Result<(), NameError> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() > 2 || parts.iter().any(|p| p.len() > MAX_LABEL_LEN) {
        return Err(NameError::PolicyName {
            value: s.to_string(),
            want,
        });
    }
    Ok(())
}

/// A Kubernetes label key: `[prefix/]name`, prefix a DNS-1123 subdomain, name 1-63 characters of
/// alphanumerics, `-`, `_` and `.` starting and ending with an alphanumeric.
pub fn validate_label_key(s: &str) -> Result<(), NameError> {
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
fn label_key_checks(s: &str) -> Result<(), NameError> {
    const WHAT: &str = "label key";
    if s.is_empty() {
        return Err(NameError::Empty { what: WHAT });
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(NameError::Forbidden {
            what: WHAT,
            value: s.to_string(),
            forbidden: "whitespace or control characters",
        });
    }
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(prefix) = prefix {
        dns_subdomain(prefix, "label key prefix").map_err(|e| NameError::LabelKeyPrefix {
            key: s.to_string(),
            prefix: Box::new(e),
        })?;
    }
    let problem = if name.is_empty() {
        "an empty name part"
    } else if name.contains('/') {
        "more than one '/'"
    } else {
        return qualified_part(name, WHAT, s);
    };
    Err(NameError::LabelKeyName {
        key: s.to_string(),
        problem,
    })
}

/// A Kubernetes label value: empty, or 1-63 characters of alphanumerics, `-`, `_` and `.`
/// starting and ending with an alphanumeric.
pub fn validate_label_value(s: &str) -> Result<(), NameError> {
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

fn qualified_part(part: &str, what: &'static str, whole: &str) -> Result<(), NameError> {
    if is_plain_qualified(part) {
        return Ok(());
    }
    qualified_part_checks(part, what, whole)
}

/// The checks of [`qualified_part`] one by one, each with its own message.
fn qualified_part_checks(part: &str, what: &'static str, whole: &str) -> Result<(), NameError> {
    if part.len() > MAX_LABEL_LEN {
        return Err(NameError::PartTooLong {
            what,
            value: whole.to_string(),
            max: MAX_LABEL_LEN,
        });
    }
    bad_char(
        part,
        what,
        whole,
        "letters, digits, '-', '_' and '.'",
        |c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'),
    )?;
    ends(part, what, whole, "a letter or digit")
}

/// A named port (IANA service name, as Kubernetes container port names): 1-15 characters of
/// lower-case letters, digits and `-`, at least one letter, no leading, trailing or double `-`.
pub fn validate_named_port(s: &str) -> Result<(), NameError> {
    let bad = |rule: &'static str| {
        Err(NameError::NamedPort {
            value: s.to_string(),
            rule,
        })
    };
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
pub fn validate_interface_name(s: &str) -> Result<(), NameError> {
    const WHAT: &str = "interface name";
    if s.is_empty() {
        return Err(NameError::Empty { what: WHAT });
    }
    if s.len() > MAX_IFACE_LEN {
        return Err(NameError::TooLong {
            what: WHAT,
            value: Some(s.to_string()),
            len: s.len(),
            max: MAX_IFACE_LEN,
        });
    }
    bad_char(s, WHAT, s, "letters, digits, '_', '.' and '-'", |c| {
        c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')
    })?;
    if s == "." || s == ".." {
        return Err(NameError::Reserved {
            what: WHAT,
            value: s.to_string(),
        });
    }
    Ok(())
}

/// A MAC address in one of the forms Go's `net.ParseMAC` accepts for 48- and 64-bit addresses:
/// `00:00:5e:00:53:01`, `00-00-5e-00-53-01`, `0000.5e00.5301` (and the 8-byte variants).
pub fn validate_mac(s: &str) -> Result<(), NameError> {
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
        Err(NameError::Mac {
            value: s.to_string(),
        })
    }
}

/// A container id: ASCII letters, digits and `-`, starting and ending with a letter or digit.
pub fn validate_container_id(s: &str) -> Result<(), NameError> {
    let ok = s.len() <= MAX_NAME_LEN
        && alnum_ends(s)
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(NameError::ContainerId {
            value: s.to_string(),
        })
    }
}

/// A free-form identifier (container id, workload, endpoint, orchestrator): non-empty, at most
/// 253 characters, no `/`, whitespace or control characters.
pub fn validate_identifier(s: &str) -> Result<(), NameError> {
    if s.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong {
            what: "",
            value: Some(s.to_string()),
            len: s.len(),
            max: MAX_NAME_LEN,
        });
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
            let err = validate_name(bad).unwrap_err().to_string();
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
                .to_string()
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
                .to_string()
                .contains("contains '.'")
        );
        assert!(validate_tier_name("Net").is_err());
        assert!(
            validate_namespace(&"a".repeat(64))
                .unwrap_err()
                .to_string()
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
            let err = validate_label_key(bad).unwrap_err().to_string();
            assert!(err.contains(want), "{bad:?}: {err}");
        }
        validate_label_value("").unwrap();
        validate_label_value("v1.2_3-x").unwrap();
        assert!(
            validate_label_value("a'b")
                .unwrap_err()
                .to_string()
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
                .to_string()
                .contains("16 characters")
        );
        assert!(
            validate_interface_name("eth+")
                .unwrap_err()
                .to_string()
                .contains("'+'")
        );
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
