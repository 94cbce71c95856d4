//! The builder's two forms of a rule.

use super::*;

#[test]
fn felix_text_matches_felix_syntax() {
    let r = Rule::new(
        vec![
            Match::Protocol {
                proto: Protocol::Tcp,
                negated: false,
            },
            Match::Net {
                side: Side::Src,
                net: "10.0.0.0/8".parse().unwrap(),
                negated: false,
            },
            Match::Ports {
                side: Side::Dst,
                ports: vec![PortRange {
                    first: 80,
                    last: 80,
                }],
                negated: false,
            },
            Match::Mark {
                value: 0x80000,
                mask: 0x80000,
                negated: false,
            },
        ],
        Target::SetMark {
            value: 0x10000,
            mask: 0x10000,
        },
    );
    assert_eq!(
        r.felix_text(),
        "-p tcp --source 10.0.0.0/8 -m multiport --destination-ports 80 \
         -m mark --mark 0x80000/0x80000 --jump MARK --set-mark 0x10000/0x10000"
    );
    let r = Rule::new(
        vec![Match::Mark {
            value: 0,
            mask: 0x20000,
            negated: false,
        }],
        Target::Drop,
    )
    .with_comment("End of tier default. Drop if no policies passed packet");
    assert_eq!(
        r.felix_text(),
        "-m comment --comment \"End of tier default. Drop if no policies passed packet\" \
         -m mark --mark 0/0x20000 --jump DROP"
    );
    assert_eq!(
        Rule::new(
            vec![],
            Target::SetMark {
                value: 0,
                mask: 0x180000
            }
        )
        .felix_text(),
        "--jump MARK --set-mark 0x0/0x180000"
    );
    assert_eq!(
        Rule::new(vec![], Target::ClearMark(0x30000)).felix_text(),
        "--jump MARK --set-mark 0/0x30000"
    );
}

#[test]
fn comments_added_later_go_first_in_both_forms() {
    let r = Rule::new(
        vec![Match::Protocol {
            proto: Protocol::Tcp,
            negated: false,
        }],
        Target::Accept,
    )
    .with_comment("a")
    .with_comment("b \"c\"");
    assert_eq!(
        r.felix_text(),
        "-m comment --comment \"a\" -m comment --comment \"b _c_\" -p tcp --jump ACCEPT"
    );
    assert_eq!(
        r.render_spec(),
        "-p tcp -m comment --comment a -m comment --comment \"b _c_\" -j ACCEPT"
    );
    let counter = Rule::default().with_comment("only");
    assert_eq!(counter.felix_text(), "-m comment --comment \"only\"");
    assert_eq!(counter.render_spec(), "-m comment --comment only");
}
