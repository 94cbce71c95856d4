//! The evaluator on hand-built chains.

use std::collections::BTreeMap;

use calc_graph::proto::{PortRange, Protocol};

use super::*;
use crate::render::build::{CtStates, Match, Rule, SetFlags, Side, Target};

#[derive(Default)]
struct Fixed {
    chains: BTreeMap<String, Vec<Rule>>,
    sets: BTreeMap<String, Vec<IpSetMember>>,
}

impl Rules for Fixed {
    fn chain(&self, name: &str) -> Option<Vec<&model::Rule>> {
        Some(self.chains.get(name)?.iter().map(Rule::model).collect())
    }
    fn set_contains(&self, name: &str, addr: IpAddr, proto: u8, port: u16) -> Option<bool> {
        let members = self.sets.get(name)?;
        Some(members.iter().any(|m| member_holds(m, addr, proto, port)))
    }
}

fn tcp(dport: u16) -> Packet {
    let mut p = Packet::new(
        "10.0.0.1".parse().unwrap(),
        "10.0.0.2".parse().unwrap(),
        6,
        40000,
        dport,
    );
    p.in_iface = "cali1".into();
    p.out_iface = "cali2".into();
    p
}

fn ports(p: u16) -> Match {
    Match::Ports {
        side: Side::Dst,
        ports: vec![PortRange { first: p, last: p }],
        negated: false,
    }
}

fn proto() -> Match {
    Match::Protocol {
        proto: Protocol::Tcp,
        negated: false,
    }
}

#[test]
fn jumps_marks_gotos_and_returns() {
    let mut f = Fixed::default();
    f.chains.insert(
        "top".into(),
        vec![
            Rule::new(
                vec![Match::InIface("cali+".into())],
                Target::Jump("pol".into()),
            ),
            Rule::new(
                vec![Match::Mark {
                    value: 0x10,
                    mask: 0x10,
                    negated: false,
                }],
                Target::Accept,
            ),
            Rule::new(vec![], Target::Drop),
        ],
    );
    f.chains.insert(
        "pol".into(),
        vec![
            Rule::new(vec![proto(), ports(80)], Target::Goto("allow".into())),
            Rule::new(vec![], Target::Return),
        ],
    );
    f.chains.insert(
        "allow".into(),
        vec![Rule::new(
            vec![],
            Target::SetMark {
                value: 0x10,
                mask: 0x10,
            },
        )],
    );
    let t = trace(&f, "top", &tcp(80)).unwrap();
    assert_eq!(t.outcome, Outcome::Accept);
    assert_eq!(t.mark, 0x10);
    let path: Vec<(&str, usize, usize)> = t
        .steps
        .iter()
        .map(|s| (s.chain.as_str(), s.rule, s.depth))
        .collect();
    assert_eq!(
        path,
        [("top", 1, 0), ("pol", 1, 1), ("allow", 1, 2), ("top", 2, 0)]
    );
    let t = trace(&f, "top", &tcp(81)).unwrap();
    assert_eq!(t.outcome, Outcome::Drop);
    assert_eq!(t.steps.last().unwrap().effect, Effect::Drop);
    // Not from a workload interface: the jump is skipped.
    let mut p = tcp(80);
    p.in_iface = "eth0".into();
    assert_eq!(trace(&f, "top", &p).unwrap().steps.len(), 1);
}

#[test]
fn sets_conntrack_and_errors() {
    let mut f = Fixed::default();
    f.sets.insert(
        "s".into(),
        vec![IpSetMember::Net("10.0.0.0/24".parse().unwrap())],
    );
    f.sets.insert(
        "n".into(),
        vec![IpSetMember::IpPort {
            addr: "10.0.0.2".parse().unwrap(),
            protocol: Protocol::Tcp,
            port: 80,
        }],
    );
    let set = |name: &str, flags| Match::Set {
        name: name.into(),
        flags,
        negated: false,
    };
    f.chains.insert(
        "c".into(),
        vec![
            Rule::new(
                vec![Match::Conntrack {
                    states: CtStates::RelatedEstablished,
                    negated: false,
                }],
                Target::Accept,
            ),
            Rule::new(
                vec![set("s", SetFlags::Src), set("n", SetFlags::DstDst)],
                Target::Accept,
            ),
            Rule::new(vec![set("missing", SetFlags::Dst)], Target::Accept),
        ],
    );
    assert_eq!(trace(&f, "c", &tcp(80)).unwrap().outcome, Outcome::Accept);
    let mut est = tcp(9);
    est.conntrack = ConntrackState::Established;
    assert_eq!(trace(&f, "c", &est).unwrap().steps[0].rule, 1);
    assert_eq!(
        trace(&f, "c", &tcp(81)),
        Err(TraceError::MissingSet {
            set: "missing".into(),
            chain: "c".into(),
            rule: 3
        })
    );
    f.chains.insert(
        "loop".into(),
        vec![Rule::new(vec![], Target::Jump("loop".into()))],
    );
    assert!(matches!(
        trace(&f, "loop", &tcp(80)),
        Err(TraceError::TooDeep { .. })
    ));
    assert!(matches!(
        trace(&f, "nope", &tcp(80)),
        Err(TraceError::MissingChain { .. })
    ));
}

/// A raw `NOTRACK` goes on through the chain and leaves the packet untracked; an untracked
/// packet's later tables see it so ([`ConntrackState::Untracked`]).
#[test]
fn notrack_marks_the_trace_untracked() {
    let mut f = Fixed::default();
    f.chains.insert(
        "raw".into(),
        vec![
            Rule::new(vec![proto(), ports(4789)], Target::NoTrack),
            Rule::new(
                vec![],
                Target::SetMark {
                    value: 0x10000,
                    mask: 0x10000,
                },
            ),
        ],
    );
    let t = trace(&f, "raw", &tcp(4789)).unwrap();
    assert!(t.untracked);
    assert_eq!(t.steps[0].effect, Effect::Continue);
    assert_eq!((t.outcome, t.mark), (Outcome::Return, 0x10000));
    assert!(!trace(&f, "raw", &tcp(80)).unwrap().untracked);
}
