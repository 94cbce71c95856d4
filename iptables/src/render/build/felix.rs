//! Felix's input syntax of the fragments (`felix/iptables/{match_builder,actions}.go`), the text
//! the `cali:` hash is over (felix-reference §6.3). Written only by the builder, fragment by
//! fragment, next to the model rule.

use std::fmt::Write;

use calc_graph::proto::Protocol;

use super::{Match, Side, Target};

pub(super) fn push_sep(s: &mut String) {
    if !s.is_empty() {
        s.push(' ');
    }
}

/// Felix's protocol name (`-p tcp`), or the number.
pub fn felix_proto(p: Protocol) -> String {
    match p {
        Protocol::Tcp => "tcp".into(),
        Protocol::Udp => "udp".into(),
        Protocol::Sctp => "sctp".into(),
        Protocol::Icmp => "icmp".into(),
        Protocol::IcmpV6 => "icmpv6".into(),
        Protocol::UdpLite => "udplite".into(),
        Protocol::Number(n) => n.to_string(),
    }
}

fn hex(v: u32) -> String {
    format!("{v:#x}")
}

fn mark_value(v: u32) -> String {
    if v == 0 { "0".into() } else { hex(v) }
}

pub(super) fn write_match(s: &mut String, m: &Match) {
    let not = |n: bool| if n { "! " } else { "" };
    let _ = match m {
        Match::Protocol { proto, negated } => {
            write!(s, "{}-p {}", not(*negated), felix_proto(*proto))
        }
        Match::Net { side, net, negated } => {
            let opt = if *side == Side::Src {
                "--source"
            } else {
                "--destination"
            };
            write!(s, "{}{opt} {net}", not(*negated))
        }
        Match::InIface(i) => write!(s, "--in-interface {i}"),
        Match::OutIface(i) => write!(s, "--out-interface {i}"),
        Match::Set { .. } | Match::NetSet { .. } => {
            let (name, flags, negated) = m.set_match().expect("a set match");
            write!(
                s,
                "-m set {}--match-set {name} {}",
                not(negated),
                flags.as_str()
            )
        }
        Match::Ports {
            side,
            ports,
            negated,
        } => {
            let opt = if *side == Side::Src {
                "--source-ports"
            } else {
                "--destination-ports"
            };
            let list: Vec<String> = ports.iter().map(|p| p.to_string()).collect();
            write!(s, "-m multiport {}{opt} {}", not(*negated), list.join(","))
        }
        Match::Icmp {
            v6,
            type_,
            code,
            negated,
        } => {
            let (m, opt) = if *v6 {
                ("icmp6", "--icmpv6-type")
            } else {
                ("icmp", "--icmp-type")
            };
            match code {
                Some(c) => write!(s, "-m {m} {}{opt} {type_}/{c}", not(*negated)),
                None => write!(s, "-m {m} {}{opt} {type_}", not(*negated)),
            }
        }
        Match::Mark {
            value,
            mask,
            negated,
        } => {
            write!(
                s,
                "-m mark {}--mark {}/{}",
                not(*negated),
                mark_value(*value),
                hex(*mask)
            )
        }
        Match::Conntrack { states, negated } => {
            write!(
                s,
                "-m conntrack {}--ctstate {}",
                not(*negated),
                states.as_str()
            )
        }
        Match::Rpfilter { negated } => {
            write!(s, "-m rpfilter{}", if *negated { " --invert" } else { "" })
        }
        Match::SrcPort { proto, port } => {
            write!(s, "-m {} --sport {port}", felix_proto(*proto))
        }
        Match::CtDirReply => write!(s, "-m conntrack --ctdir REPLY"),
        Match::Limit { per_second, burst } => {
            write!(
                s,
                "-m limit --limit {per_second}/second --limit-burst {burst}"
            )
        }
    };
}

pub(super) fn write_target(s: &mut String, t: &Target) {
    let _ = match t {
        Target::Accept => write!(s, "--jump ACCEPT"),
        Target::Drop => write!(s, "--jump DROP"),
        Target::Return => write!(s, "--jump RETURN"),
        Target::Jump(c) => write!(s, "--jump {c}"),
        Target::Goto(c) => write!(s, "--goto {c}"),
        Target::SetMark { value, mask } => {
            write!(s, "--jump MARK --set-mark {}/{}", hex(*value), hex(*mask))
        }
        Target::ClearMark(mask) => write!(s, "--jump MARK --set-mark 0/{}", hex(*mask)),
        Target::Log { prefix } => write!(s, "--jump LOG --log-prefix \"{prefix}: \" --log-level 5"),
        Target::Nflog { group, prefix } => {
            write!(
                s,
                "--jump NFLOG --nflog-group {group} --nflog-prefix {prefix}"
            )
        }
        Target::Masquerade { random_fully } => write!(
            s,
            "--jump MASQUERADE{}",
            if *random_fully { " --random-fully" } else { "" }
        ),
        Target::Nfqueue { num } => write!(s, "--jump NFQUEUE --queue-num {num}"),
    };
}
