//! A DNS response → the (name, address, TTL) facts it proves, CNAME chains followed.
//!
//! Only what a stub resolver would use is learned: a NOERROR, non-truncated response to a
//! standard query; from its answer section, the chain that starts at each question's name and
//! follows CNAME records (loop-safe, at most [`MAX_CHAIN`] hops), and the A/AAAA records of the
//! names on that chain. Every address is attributed to every name of the chain up to the name
//! holding it (the queried name included), with the smallest TTL along the way. Records for names
//! off the chain (an extra A record for an unrelated name) are ignored: no client would use them,
//! so they must not open anything. Names are compared case-insensitively and kept lowercase
//! without the root's dot; a name with a byte outside `[A-Za-z0-9_-]` in a label can match no
//! valid pattern and is never learned (a chain may still pass through it).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData};

/// CNAME hops followed from a question's name.
pub const MAX_CHAIN: usize = 16;
/// Answer records looked at (the rest of a huge answer is ignored: fail closed).
pub const MAX_RECORDS: usize = 512;
/// Questions looked at (real responses have one).
pub const MAX_QUESTIONS: usize = 4;

/// One learned fact: `name` resolved to `addr`, valid for `ttl` seconds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fact {
    pub name: String,
    pub addr: IpAddr,
    pub ttl: u32,
}

/// Why nothing was learned from a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("malformed DNS message: {0}")]
    Malformed(String),
    #[error("not a response")]
    NotResponse,
    #[error("opcode {0} is not a standard query")]
    OpCode(String),
    #[error("response code {0}")]
    ResponseCode(String),
    #[error("truncated response (the client retries over TCP)")]
    Truncated,
}

/// Labels in lowercase: the key names are compared by.
type Key = Vec<Vec<u8>>;

fn key(name: &Name) -> Key {
    name.iter().map(|l| l.to_ascii_lowercase()).collect()
}

/// The presentation form of a name if every label is made of `[a-z0-9_-]` (after lowercasing).
fn text(k: &Key) -> Option<String> {
    if k.is_empty()
        || !k.iter().all(|l| {
            !l.is_empty()
                && l.iter()
                    .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
        })
    {
        return None;
    }
    let labels: Vec<&str> = k
        .iter()
        .map(|l| std::str::from_utf8(l).expect("ASCII checked above"))
        .collect();
    Some(labels.join("."))
}

/// Parses a DNS message and returns what it proves, sorted and deduplicated (the largest TTL
/// kept per name and address). Never panics, whatever the bytes.
pub fn facts(bytes: &[u8]) -> Result<Vec<Fact>, AnswerError> {
    let msg = Message::from_vec(bytes).map_err(|e| AnswerError::Malformed(e.to_string()))?;
    let meta = &msg.metadata;
    if meta.message_type != MessageType::Response {
        return Err(AnswerError::NotResponse);
    }
    if meta.op_code != OpCode::Query {
        return Err(AnswerError::OpCode(format!("{:?}", meta.op_code)));
    }
    if meta.response_code != ResponseCode::NoError {
        return Err(AnswerError::ResponseCode(format!(
            "{:?}",
            meta.response_code
        )));
    }
    if meta.truncation {
        return Err(AnswerError::Truncated);
    }
    let mut cnames: HashMap<Key, (Key, u32)> = HashMap::new();
    let mut addrs: HashMap<Key, Vec<(IpAddr, u32)>> = HashMap::new();
    for r in msg.answers.iter().take(MAX_RECORDS) {
        if r.dns_class != DNSClass::IN {
            continue;
        }
        match &r.data {
            RData::A(a) => addrs
                .entry(key(&r.name))
                .or_default()
                .push((IpAddr::V4(a.0), r.ttl)),
            RData::AAAA(a) => addrs
                .entry(key(&r.name))
                .or_default()
                .push((IpAddr::V6(a.0), r.ttl)),
            RData::CNAME(c) => {
                // A name has at most one CNAME; a second one is ignored.
                cnames.entry(key(&r.name)).or_insert((key(&c.0), r.ttl));
            }
            _ => {}
        }
    }
    let mut out: BTreeMap<(String, IpAddr), u32> = BTreeMap::new();
    for q in msg.queries.iter().take(MAX_QUESTIONS) {
        // The chain: (name, smallest CNAME TTL from the question to it).
        let mut chain: Vec<(Key, u32)> = vec![(key(&q.name), u32::MAX)];
        while chain.len() <= MAX_CHAIN {
            let (cur, ttl) = chain.last().expect("never empty");
            let Some((next, cttl)) = cnames.get(cur) else {
                break;
            };
            if chain.iter().any(|(k, _)| k == next) {
                break; // a CNAME loop
            }
            let ttl = (*ttl).min(*cttl);
            chain.push((next.clone(), ttl));
        }
        for (i, (k, chain_ttl)) in chain.iter().enumerate() {
            let Some(records) = addrs.get(k) else {
                continue;
            };
            for &(addr, rttl) in records {
                let ttl = rttl.min(*chain_ttl);
                for (name_key, _) in &chain[..=i] {
                    if let Some(name) = text(name_key) {
                        let e = out.entry((name, addr)).or_insert(ttl);
                        *e = (*e).max(ttl);
                    }
                }
            }
        }
    }
    Ok(out
        .into_iter()
        .map(|((name, addr), ttl)| Fact { name, addr, ttl })
        .collect())
}

#[cfg(test)]
pub(crate) mod build {
    //! DNS responses for the tests, written with hickory-proto's encoder.
    use std::net::IpAddr;

    use hickory_proto::op::{Message, MessageType, OpCode, Query};
    use hickory_proto::rr::domain::Label;
    use hickory_proto::rr::rdata::{A, AAAA, CNAME};
    use hickory_proto::rr::{Name, RData, Record, RecordType};

    /// A name from its dotted form, any bytes allowed in a label.
    pub fn name(s: &str) -> Name {
        let mut n = Name::from_labels(
            s.trim_end_matches('.')
                .split('.')
                .map(|l| Label::from_raw_bytes(l.as_bytes()).unwrap()),
        )
        .unwrap();
        n.set_fqdn(true);
        n
    }

    /// A record of the answer section.
    pub enum Rr<'a> {
        Addr(&'a str, &'a str, u32),
        Cname(&'a str, &'a str, u32),
    }

    pub fn response(question: &str, answers: &[Rr<'_>]) -> Vec<u8> {
        let mut m = Message::query();
        m.metadata.message_type = MessageType::Response;
        m.metadata.op_code = OpCode::Query;
        m.metadata.id = 0x1234;
        m.queries.push(Query::query(name(question), RecordType::A));
        for rr in answers {
            let rec = match rr {
                Rr::Addr(n, a, ttl) => {
                    let data = match a.parse::<IpAddr>().unwrap() {
                        IpAddr::V4(v) => RData::A(A(v)),
                        IpAddr::V6(v) => RData::AAAA(AAAA(v)),
                    };
                    Record::from_rdata(name(n), *ttl, data)
                }
                Rr::Cname(n, t, ttl) => {
                    Record::from_rdata(name(n), *ttl, RData::CNAME(CNAME(name(t))))
                }
            };
            m.answers.push(rec);
        }
        m.to_vec().unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;
    use proptest::prelude::*;

    fn f(name: &str, addr: &str, ttl: u32) -> Fact {
        Fact {
            name: name.into(),
            addr: addr.parse().unwrap(),
            ttl,
        }
    }

    #[test]
    fn a_and_aaaa_of_the_question() {
        let r = response(
            "API.Example.com.",
            &[
                Rr::Addr("api.example.com.", "192.0.2.1", 60),
                Rr::Addr("api.example.com.", "2001:db8::1", 30),
            ],
        );
        assert_eq!(
            facts(&r).unwrap(),
            vec![
                f("api.example.com", "192.0.2.1", 60),
                f("api.example.com", "2001:db8::1", 30)
            ]
        );
    }

    #[test]
    fn a_cname_chain_is_attributed_to_every_name_with_the_smallest_ttl() {
        let r = response(
            "www.example.com.",
            &[
                Rr::Cname("www.example.com.", "edge.cdn.net.", 300),
                Rr::Cname("edge.cdn.net.", "e1.cdn.net.", 20),
                Rr::Addr("e1.cdn.net.", "198.51.100.7", 100),
                // Off the chain: never learned.
                Rr::Addr("evil.example.com.", "203.0.113.66", 100),
            ],
        );
        assert_eq!(
            facts(&r).unwrap(),
            vec![
                f("e1.cdn.net", "198.51.100.7", 20),
                f("edge.cdn.net", "198.51.100.7", 20),
                f("www.example.com", "198.51.100.7", 20),
            ]
        );
    }

    #[test]
    fn cname_loops_and_long_chains_are_bounded() {
        let r = response(
            "a.example.com.",
            &[
                Rr::Cname("a.example.com.", "b.example.com.", 60),
                Rr::Cname("b.example.com.", "a.example.com.", 60),
                Rr::Addr("b.example.com.", "192.0.2.2", 60),
            ],
        );
        assert_eq!(
            facts(&r).unwrap(),
            vec![
                f("a.example.com", "192.0.2.2", 60),
                f("b.example.com", "192.0.2.2", 60)
            ]
        );
        // A chain of 40 hops: only MAX_CHAIN of them are followed, so the address at its end is
        // not learned.
        let names: Vec<String> = (0..41).map(|i| format!("n{i}.example.com.")).collect();
        let mut rrs: Vec<Rr<'_>> = (0..40)
            .map(|i| Rr::Cname(&names[i], &names[i + 1], 60))
            .collect();
        rrs.push(Rr::Addr(&names[40], "192.0.2.3", 60));
        assert!(facts(&response(&names[0], &rrs)).unwrap().is_empty());
    }

    #[test]
    fn only_noerror_untruncated_standard_responses_teach() {
        let r = response(
            "a.example.com.",
            &[Rr::Addr("a.example.com.", "192.0.2.1", 5)],
        );
        let mut m = Message::from_vec(&r).unwrap();
        m.metadata.message_type = MessageType::Query;
        assert_eq!(facts(&m.to_vec().unwrap()), Err(AnswerError::NotResponse));
        let mut m = Message::from_vec(&r).unwrap();
        m.metadata.truncation = true;
        assert_eq!(facts(&m.to_vec().unwrap()), Err(AnswerError::Truncated));
        let mut m = Message::from_vec(&r).unwrap();
        m.metadata.response_code = ResponseCode::NXDomain;
        assert!(matches!(
            facts(&m.to_vec().unwrap()),
            Err(AnswerError::ResponseCode(_))
        ));
        assert!(matches!(
            facts(&r[..r.len() - 3]),
            Err(AnswerError::Malformed(_))
        ));
        assert!(matches!(facts(&[]), Err(AnswerError::Malformed(_))));
    }

    #[test]
    fn names_with_odd_bytes_are_never_learned() {
        let r = response(
            "a.example.com.",
            &[
                Rr::Cname("a.example.com.", "x y.example.com.", 60),
                Rr::Addr("x y.example.com.", "192.0.2.9", 60),
            ],
        );
        assert_eq!(
            facts(&r).unwrap(),
            vec![f("a.example.com", "192.0.2.9", 60)]
        );
    }

    #[test]
    fn a_compression_pointer_loop_is_an_error_not_a_hang() {
        let mut r = response(
            "a.example.com.",
            &[Rr::Addr("a.example.com.", "192.0.2.1", 5)],
        );
        // The answer's owner name is a pointer (0xc00c) to the question's name; point it at itself.
        let at = r
            .windows(2)
            .rposition(|w| w == [0xc0, 0x0c])
            .expect("compressed owner name");
        r[at + 1] = at as u8;
        assert!(facts(&r).is_err());
        // A pointer to a pointer to the first one.
        let mut r2 = r.clone();
        r2[at + 1] = 0x0c;
        r2[12] = 0xc0;
        r2[13] = at as u8;
        assert!(facts(&r2).is_err());
    }

    #[test]
    fn a_huge_answer_is_bounded() {
        let addrs: Vec<String> = (0..2000u32)
            .map(|i| format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
            .collect();
        let rrs: Vec<Rr<'_>> = addrs
            .iter()
            .map(|a| Rr::Addr("big.example.com.", a, 60))
            .collect();
        let got = facts(&response("big.example.com.", &rrs)).unwrap();
        assert_eq!(got.len(), MAX_RECORDS);
    }

    proptest! {
        /// Random bytes and random mutations of a real response: no panic, and whatever is
        /// learned names a valid-looking lowercase name.
        #[test]
        fn mutated_responses_never_panic_nor_learn_garbage(
            flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..8),
            cut in any::<usize>(),
        ) {
            let mut r = response(
                "www.example.com.",
                &[
                    Rr::Cname("www.example.com.", "e.cdn.net.", 30),
                    Rr::Addr("e.cdn.net.", "192.0.2.1", 60),
                    Rr::Addr("e.cdn.net.", "2001:db8::5", 60),
                ],
            );
            for (at, b) in flips {
                let n = r.len();
                r[at % n] = b;
            }
            r.truncate(cut % (r.len() + 1));
            if let Ok(fs) = facts(&r) {
                prop_assert!(fs.len() <= 2 * MAX_RECORDS * (MAX_CHAIN + 1));
                for fact in fs {
                    prop_assert!(!fact.name.is_empty());
                    prop_assert!(fact.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_' || b == b'.'));
                }
            }
        }
    }
}
