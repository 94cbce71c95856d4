//! `felixrs flows`: the packets our NFLOG rules send (denied packets with `--log-denied`, the Log
//! action with `--log-action nflog`), each printed with the policy, tier or profile that decided
//! it and the namespace/pod of its addresses. Root, in the node's network namespace.
//!
//! It binds NFLOG groups 1 (ingress) and 2 (egress) (Felix's) and 3 (the Log action) on a netlink
//! socket (`netlink-sys` + `netlink-packet-netfilter`, the rust-netlink crates: pure Rust, no C
//! library) and decodes each packet's prefix (`<A><O><D><rule>|<id>`: action `D`eny or `L`og, owner
//! `P`olicy or p`R`ofile, direction `I`/`E`) and IP header. Addresses are resolved with the
//! workload endpoints of the agent's snapshot (`--state-dir`) or of manifests. Text from the
//! kernel (prefixes) and from the datastore (names) is escaped in the text output, and a JSON
//! string in `--json` (one object per line), so no name can forge a line.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use iptables::render::names;
use netlink_sys::Socket;
use serde::Serialize;

use crate::flowlog::nflog;
pub use crate::flowlog::nflog::{IpHeader, decode_ip, decode_prefix};

use crate::cmd::shared::dataplane_args::{DataplaneArgs, LOG_ACTION_NFLOG_GROUP};
use crate::cmd::shared::node_view::{
    SourceArgs, ViewStamp, origin_note, render_node, state_dir_changed,
};
use crate::cmd::shared::pods::Pods;
use crate::cmd::shared::{Answer, finish};
use crate::cmd::stats::cell;

/// `felixrs flows`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub source: SourceArgs,
    /// This node's name.
    #[arg(long, env = "FELIXRS_NODE_NAME")]
    pub node_name: String,
    /// One JSON object per packet, per line.
    #[arg(long)]
    pub json: bool,
    /// Stop after this many packets.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub timeout: Option<f64>,
    #[command(flatten)]
    pub dataplane: DataplaneArgs,
}

/// One logged packet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Flow {
    /// `deny` or `log`.
    pub action: String,
    /// `ingress` or `egress`.
    pub direction: String,
    /// `policy`, `profile`, `tier-end` or `no-profile`.
    pub kind: String,
    /// The policy (as `kind ns/name` when known), profile, or tier.
    pub decided_by: String,
    /// The rule's index in the policy or profile, when the prefix names one.
    pub rule: Option<u32>,
    pub prefix: String,
    pub group: u16,
    pub protocol: u8,
    pub src: String,
    pub dst: String,
    pub src_port: Option<u16>,
    pub dst_port: Option<u16>,
    /// `namespace/pod` of the source and destination, when they are workloads.
    pub src_pod: Option<String>,
    pub dst_pod: Option<String>,
}

impl Flow {
    /// An address that is no pod, or a policy known only by its prefix id: perhaps one the
    /// view does not hold yet.
    fn unresolved(&self) -> bool {
        let raw_policy = self.kind == "policy"
            && self.prefix.split_once('|').map(|(_, id)| id) == Some(&self.decided_by);
        self.src_pod.is_none() || self.dst_pod.is_none() || raw_policy
    }
}

/// How often a `--state-dir` run asks whether the view changed while no packet comes, and at
/// most how often a packet with an unknown address or policy makes it ask.
const FOLLOW_IDLE: Duration = Duration::from_secs(1);
const FOLLOW_MISS: Duration = Duration::from_millis(100);

/// The names a run resolves with, followed: with `--state-dir`, re-read when the running
/// agent's applied view (or, without an agent, the snapshot file) changes, so a run started
/// before a pod or policy existed names it once it does.
struct Follow<'a> {
    args: &'a Args,
    names: Names,
    stamp: Option<ViewStamp>,
    checked: Instant,
}

impl Follow<'_> {
    /// Re-reads the view if it changed (asking at most once per `gap`); true if it did.
    fn refresh(&mut self, gap: Duration) -> bool {
        let (Some(dir), Some(stamp)) = (&self.args.source.state_dir, &self.stamp) else {
            return false;
        };
        if self.checked.elapsed() < gap {
            return false;
        }
        self.checked = Instant::now();
        if !state_dir_changed(dir, stamp) {
            return false;
        }
        match render_node(
            &self.args.source,
            &self.args.node_name,
            &self.args.dataplane,
        ) {
            Ok(view) => {
                self.names = names_of(&view);
                self.stamp = view.stamp;
                if let Some(rev) = view.revision {
                    eprintln!(
                        "felixrs flows: names from the agent's snapshot at datastore revision {rev}{}",
                        origin_note(self.stamp.as_ref())
                    );
                }
                true
            }
            Err(e) => {
                eprintln!("felixrs flows: keeping the previous names: {e:#}");
                false
            }
        }
    }
}

/// What the node's view knows: workload addresses and policy prefix ids.
struct Names {
    pods: Pods,
    /// `policy_chain_id` (what our prefixes carry) -> the policy as people name it.
    policies: HashMap<String, String>,
}

fn names_of(view: &crate::cmd::shared::node_view::NodeView) -> Names {
    let policies = view.renderer.policy_ids();
    Names {
        pods: Pods::of(view),
        policies: (policies.map(|id| (names::policy_chain_id(id), id.to_string()))).collect(),
    }
}

fn flow(names: &Names, group: u16, prefix: &str, payload: &[u8]) -> Option<Flow> {
    let (action, kind, direction, rule, id) = decode_prefix(prefix)?;
    let ip = decode_ip(payload)?;
    let decided_by = match kind {
        "policy" => names
            .policies
            .get(id)
            .cloned()
            .unwrap_or_else(|| id.to_string()),
        "tier-end" => format!("end of tier {id}"),
        "no-profile" => "no profile matched".to_string(),
        _ => format!("profile {id}"),
    };
    Some(Flow {
        action: action.into(),
        direction: direction.into(),
        kind: kind.into(),
        decided_by,
        rule,
        prefix: prefix.to_string(),
        group,
        protocol: ip.protocol,
        src: ip.src.to_string(),
        dst: ip.dst.to_string(),
        src_port: ip.src_port,
        dst_port: ip.dst_port,
        src_pod: names.pods.by_addr(ip.src).map(|p| p.id.clone()),
        dst_pod: names.pods.by_addr(ip.dst).map(|p| p.id.clone()),
    })
}

/// One line of text for a flow; every field from outside is escaped.
pub fn text_line(f: &Flow) -> String {
    let end = |addr: &str, port: Option<u16>, pod: &Option<String>| {
        let a = match port {
            Some(p) if addr.contains(':') => format!("[{addr}]:{p}"),
            Some(p) => format!("{addr}:{p}"),
            None => addr.to_string(),
        };
        match pod {
            Some(p) => format!("{a} ({})", cell(p)),
            None => a,
        }
    };
    let rule = f.rule.map(|r| format!(" rule {r}")).unwrap_or_default();
    format!(
        "{} {} by {}{rule}: proto {} {} -> {} [{}]",
        f.action.to_uppercase(),
        f.direction,
        cell(&f.decided_by),
        f.protocol,
        end(&f.src, f.src_port, &f.src_pod),
        end(&f.dst, f.dst_port, &f.dst_pod),
        cell(&f.prefix)
    )
}

/// Binds NFLOG groups 1, 2 and 3 (both families).
fn open() -> anyhow::Result<Socket> {
    Ok(nflog::open(&[1, 2, LOG_ACTION_NFLOG_GROUP], 256)?)
}

impl Args {
    pub fn run(self) -> std::process::ExitCode {
        finish("flows", self.flows().map(|()| Answer::default()))
    }

    fn flows(&self) -> anyhow::Result<()> {
        use std::io::Write as _;
        let view = render_node(&self.source, &self.node_name, &self.dataplane)?;
        let mut follow = Follow {
            args: self,
            names: names_of(&view),
            stamp: view.stamp,
            checked: Instant::now(),
        };
        let socket = open()?;
        eprintln!(
            "felixrs flows: listening on NFLOG groups 1 (ingress), 2 (egress), 3 (Log action)"
        );
        let deadline = self
            .timeout
            .map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
        let mut seen = 0u64;
        let mut buf = vec![0u8; 65536];
        let mut out = std::io::stdout().lock();
        loop {
            if deadline.is_some_and(|d| Instant::now() >= d)
                || self.count.is_some_and(|c| seen >= c)
            {
                return Ok(());
            }
            let n = match socket.recv(&mut &mut buf[..], 0) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    follow.refresh(FOLLOW_IDLE);
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                Err(e) => return Err(e).context("netlink recv"),
            };
            for p in nflog::packets(&buf[..n]) {
                let decode = |names: &Names| flow(names, p.group, &p.prefix, &p.payload);
                let mut f = decode(&follow.names);
                // A name it cannot resolve may be one the agent just applied.
                if f.as_ref().is_some_and(Flow::unresolved) && follow.refresh(FOLLOW_MISS) {
                    f = decode(&follow.names);
                }
                if let Some(f) = f {
                    let line = if self.json {
                        serde_json::to_string(&f)?
                    } else {
                        text_line(&f)
                    };
                    writeln!(out, "{line}")?;
                    out.flush()?;
                    seen += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_decode() {
        assert_eq!(
            decode_prefix("DPI|default"),
            Some(("deny", "tier-end", "ingress", None, "default"))
        );
        assert_eq!(
            decode_prefix("DRE|__NO_MATCH__"),
            Some(("deny", "no-profile", "egress", None, "__NO_MATCH__"))
        );
        assert_eq!(
            decode_prefix("DPI0|np/prod/web"),
            Some(("deny", "policy", "ingress", Some(0), "np/prod/web"))
        );
        assert_eq!(
            decode_prefix("LRE3|kns.prod"),
            Some(("log", "profile", "egress", Some(3), "kns.prod"))
        );
        assert_eq!(decode_prefix("calico-packet"), None);
        assert_eq!(decode_prefix("XPI|x"), None);
    }

    #[test]
    fn ip_headers_decode() {
        let mut v4 = vec![0u8; 24];
        v4[0] = 0x45;
        v4[9] = 6;
        v4[12..16].copy_from_slice(&[10, 0, 0, 1]);
        v4[16..20].copy_from_slice(&[10, 0, 0, 2]);
        v4[20..24].copy_from_slice(&[0x9c, 0x40, 0x23, 0x82]);
        let IpHeader {
            src: s,
            dst: d,
            protocol: p,
            src_port: sp,
            dst_port: dp,
        } = decode_ip(&v4).unwrap();
        assert_eq!(
            (s.to_string(), d.to_string(), p),
            ("10.0.0.1".into(), "10.0.0.2".into(), 6)
        );
        assert_eq!((sp, dp), (Some(40000), Some(9090)));
        assert_eq!(decode_ip(&[0x45]), None);
    }

    #[test]
    fn a_hostile_prefix_or_name_stays_on_its_line() {
        let f = Flow {
            action: "deny".into(),
            direction: "ingress".into(),
            kind: "policy".into(),
            decided_by: "NetworkPolicy x/evil\nDENY forged".into(),
            rule: Some(0),
            prefix: "DPI0|a\"b\nc".into(),
            group: 1,
            protocol: 6,
            src: "10.0.0.1".into(),
            dst: "10.0.0.2".into(),
            src_port: Some(1),
            dst_port: Some(2),
            src_pod: Some("ns/--pod \"x\"".into()),
            dst_pod: None,
        };
        let line = text_line(&f);
        assert_eq!(line.lines().count(), 1, "{line}");
        let json = serde_json::to_string(&f).unwrap();
        assert_eq!(json.lines().count(), 1);
        let back: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(back["decided_by"], "NetworkPolicy x/evil\nDENY forged");
    }
}
