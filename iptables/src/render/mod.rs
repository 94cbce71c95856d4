//! Renderer: calc-graph output -> the desired Calico-style chains and IP sets (pure).
//!
//! [`Renderer`] consumes [`calc_graph::proto::Output`]s incrementally and produces, for IPv4 and
//! IPv6, the applier's [`DesiredState`](crate::desired::DesiredState) (filter, nat, raw, mangle; hook
//! rules, IP sets), and on request only what changed since the last call ([`Delta`]).
//!
//! # Layout (as Felix, felix-reference §2)
//! * hooks: `INPUT`/`FORWARD`/`OUTPUT` -> `cali-INPUT`/`cali-FORWARD`/`cali-OUTPUT` at the top
//!   (with host endpoints, these also dispatch to the host endpoint chains, [`host`]);
//!   `FORWARD` ends with "Policy explicitly accepted packet." ACCEPT + set-accept-mark (appended);
//!   nat `PREROUTING`/`OUTPUT` (top) and `POSTROUTING` (appended) -> `cali-PREROUTING`/...
//! * `cali-FORWARD` -> `cali-from-wl-dispatch` / `cali-to-wl-dispatch` (prefix tree, felix-reference §2.3, split
//!   further above 16 names per bin) -> `cali-fw-<iface>` / `cali-tw-<iface>` -> (with
//!   [`RenderConfig::share_chains`], the default: `--goto` the shared `cali-so-<hash>` /
//!   `cali-si-<hash>` of every endpoint with the same tiers, policies and profiles ->)
//!   `cali-pi-`/`cali-po-` (policies), `cali-pri-`/`cali-pro-` (profiles). `cali-INPUT` ->
//!   `cali-wl-to-host` -> `cali-from-wl-dispatch`.
//! * Verdicts are mark bits ([`marks`]); rules are rendered per felix-reference §4 ([`rule`]); names per felix-reference §5
//!   ([`names`]); every rule's `cali:` id is Felix's SHA-224 chain over Felix's input syntax
//!   ([`hash`], [`build::Rule::felix_text`]), so our ids equal Felix's for identical rules.
//! * Lazy programming (felix-reference §2.10): a policy/profile chain exists only while an endpoint chain jumps to
//!   it; an IP set exists in a family only while a chain of that family references it.
//!
//! # Use
//! ```
//! use calc_graph::proto::{IpVersion, Output};
//! use iptables::render::{RenderConfig, Renderer};
//! let mut r = Renderer::new(RenderConfig::default()).unwrap();
//! let errors = r.apply_all([Output::InSync]); // one bad object never stops the others
//! assert!(errors.is_empty());
//! assert!(r.flush().is_empty()); // re-render what changed (errors: objects rendered fail-closed)
//! let v4 = r.desired(IpVersion::V4); // full state for the applier ...
//! assert!(v4.tables.values().any(|t| t.chains.contains_key("cali-from-wl-dispatch")));
//! let delta = r.take_delta(IpVersion::V4); // ... or only what changed since the last take_delta
//! assert!(!delta.is_empty());
//! ```
//!
//! # Tests
//! `iptables/tests/render_golden.rs` (ids from a live Felix dump, felix-reference §2.4/§4.4 examples),
//! `render_felix_policy.rs` (Felix's `policy_test.go` tables), `render_host.rs` (host endpoints,
//! failsafes; Felix's ids for the static host endpoint rules), `render_host_tables.rs` (preDNAT
//! in mangle, doNotTrack in raw), `host_endpoint_kernel.rs` (host policy and failsafes on the
//! real kernel), `host_tables_kernel.rs` (a NodePort denied before DNAT, untracked traffic with
//! no conntrack entry, failsafes in mangle and raw), `render_eval.rs` (packet evaluator
//! property tests), `render_hostile.rs`, `render_state.rs`, `render_kernel.rs` (real kernel round
//! trip in a throwaway netns). Benchmark: `iptables/benches/render.rs`.
//!
//! # Simplifications against Felix (deliberate; features out of scope)
//! * Host endpoints ([`host`]) are rendered in the filter table only, as Felix renders them there:
//!   `cali-fh-`/`cali-th-`/`cali-fhfw-`/`cali-thfw-<iface>`, the host endpoint dispatch from
//!   `cali-INPUT`/`cali-OUTPUT`/`cali-FORWARD` (with their "Host endpoint policy accepted packet."
//!   rules), the `*` endpoint as the dispatch default, and `cali-failsafe-in`/`-out` (Felix's
//!   default ports, [`RenderConfig::failsafe_inbound`]) jumped to before any host policy. With no
//!   host endpoint none of these rules or chains exist (the static chains are as without host
//!   endpoint support). `preDNAT` policies are rendered in mangle and `doNotTrack` policies in raw
//!   ([`host_tables`]), with the failsafe copies, only while such a policy selects an endpoint.
//!   Differences there: mangle has only `cali-failsafe-in` (nothing of ours jumps to its `-out`
//!   copy); raw `cali-PREROUTING` keeps our anti-spoofing rules (an `-i cali+` rpfilter match)
//!   inside Felix's scratch0 marking; an untracked allow's `NOTRACK` is in the endpoint chain after
//!   the policy jump (accept bit set), not in the policy chain. Not rendered: mangle
//!   `cali-POSTROUTING`'s policing of DNAT'd host egress. A host endpoint is programmed by its interface name whether or not the
//!   interface exists (Felix waits for the interface); the lowest-named endpoint wins an interface.
//! * No IPIP/VXLAN/WireGuard/IPVS/BPF rules in `cali-INPUT`/`cali-OUTPUT`; no `cali-cidr-block`.
//!   The per-workload "Drop VXLAN/IPinIP encapped packets originating in workloads" rules are kept
//!   (Felix's default) unless `allow_encap_from_workloads`.
//! * mangle holds only the DNS hold of FQDN policy ([`dns_hold`]: trusted servers' responses to
//!   workloads go to the learner's NFQUEUE), and only with trusted servers; raw holds only the anti-spoofing check (no untracked, pre-DNAT or
//!   HEP policy). raw `cali-PREROUTING` is `-i cali+ -m rpfilter --invert -j DROP`: Felix's strict
//!   RPF check without its mark bookkeeping. With [`SourceSpoofing::Any`] a `-i cali+ -j
//!   cali-rpf-skip` comes first, and `cali-rpf-skip` ACCEPTs (ends raw for) `-i <iface> -s <prefix>`
//!   for each endpoint's `allowSpoofedSourcePrefixes`, as Felix does.
//! * nat: the hook chains, `cali-nat-outgoing` from the IP pools ([`nat`]: masquerade from
//!   natOutgoing pools to destinations outside every pool), and the empty `cali-fip-dnat`/
//!   `cali-fip-snat` (no floating IPs); no tunnel-device MASQUERADE rules (no IPIP/VXLAN/WireGuard).
//! * No policy-group chains (`cali-gi-`/`cali-go-`, felix-reference §2.5). Instead, and going further, whole
//!   endpoint chains are shared ([`endpoint`]): the kernel's rule count grows with the number of
//!   distinct policy combinations on the node, not with its pods. In the same layout a policy's
//!   or profile's Allow, Pass or Deny is one rule that goes (`-g`) to the shared verdict chain
//!   `cali-verdict-accept`/`-pass`/`-drop`, which sets the mark (the drop chain then DROPs), in
//!   place of Felix's mark rule + `-m mark … -j RETURN`/`DROP` pair: the chain gone to returns
//!   where the RETURN would have, so verdicts are the same with half the rules (trace, stats and
//!   `trace --kernel` name the policy rule that went there). `share_chains: false` renders
//!   Felix's per-endpoint chains (each endpoint jumps to each policy) and Felix's verdict pairs.
//! * In the shared layout a rule's CIDR list that Felix renders as a scratch-mark OR block (several
//!   positive `nets` on a side) or negated-net block (`notNets` beside another net on that side)
//!   is one `-m set [!] --match-set cali40c:<hash> src|dst` on a `hash:net` set holding exactly
//!   those nets of the family ([`build::Match::NetSet`], [`names::net_set_id`]): content-addressed
//!   (SHA-256 of the family and the sorted, de-duplicated nets), so equal lists in any number of
//!   policies share one set; it exists in a family exactly while a chain of that family names it
//!   (declared in the same change as the first such chain, gone with the last), like every set
//!   here. A single net stays `-s`/`-d`; port OR blocks keep the scratch marks. With
//!   `share_chains: false` the output is Felix's, byte for byte.
//! * No staged policies, no QoS, no flow logs (the NFLOG rules of felix-reference §4.3 with flow logs on).
//! * IPv6 neighbour discovery (ICMPv6 130-133, 135, 136) is accepted where Felix accepts it: at the
//!   top of `cali-wl-to-host` (workload -> host, before egress policy). NDP never crosses
//!   `cali-FORWARD` (link-local) and host -> workload traffic is not policed (`cali-OUTPUT` RETURNs
//!   for `cali+`), so the endpoint chains need no NDP rules.
//! * The LOG prefix is used verbatim (sanitised to `[A-Za-z0-9 _@+=:,./-]`, cut to 27 bytes):
//!   Felix's `%t`/`%k`/`%n`/`%p` substitutions are not implemented.
//! * Log action: `LOG` as Felix (felix-reference §4.3), or `NFLOG` (group from [`LogAction::Nflog`]) with the
//!   prefix `L<P|R><I|E><rule index>|<policy id>` (≤ 63 chars, hashed when longer).
//!
//! # Deliberate differences in behaviour
//! * OR blocks clear TB at the start of each positive block after the second (Felix's TB bug,
//!   felix-reference §4.4); outputs with ≤ 2 positive blocks are byte-identical to Felix's.
//! * A profile chain with a Pass rule starts by clearing the pass bit: profiles are entered with
//!   it possibly set (last tier passed, or an earlier profile passed), and Felix's check
//!   "RETURN if pass bit" would then skip the rest of the profile (possibly a Deny, so a later
//!   profile could allow). Found by the endpoint-chain property test in `render_eval.rs`.
//! * A negated CIDR list that only holds other-family CIDRs is dropped instead of the whole rule.
//! * The IP pool sets (`cali40all-ipam-pools`, `cali40masq-ipam-pools`) exist only while
//!   `cali-nat-outgoing` references them (no masquerading pool: no rule, no sets), as every set
//!   here; Felix's masq manager creates both sets up front. Felix's v3.32 set id `all-ipam-pools`
//!   is used (master renamed it `network-ip-pools`). Pools are keyed by resource name, not CIDR.
//! * Human comments are cut to 255 bytes (the kernel's limit), not 256.
//! * Names with characters outside `[A-Za-z0-9._:/-]` are always hashed into chain names.
//! * A policy that cannot be rendered safely (ports without a port protocol, ICMP fields without
//!   the family's ICMP protocol, an unknown IP set) becomes a single DROP chain and an error;
//!   an endpoint jumping to a policy the renderer has never seen jumps to a DROP chain too.

pub mod build;
pub mod dispatch;
pub mod dns_hold;
pub mod domains;
pub mod endpoint;
mod family;
pub mod hash;
pub mod host;
pub mod host_tables;
pub mod marks;
pub mod names;
pub mod nat;
pub mod rule;
mod shared;
mod state;
pub mod static_chains;
pub mod trace;
pub mod trace_kernel;

use std::net::SocketAddr;

use calc_graph::proto::{EndpointId, PolicyId};

pub use domains::{ActiveDomainSet, DomainMembers, LearnedAddr, NothingLearned};
pub use marks::MarkBits;
pub use rule::{DenyLog, FLOW_LOG_NFLOG_SIZE, LogAction, RuleError};
pub use state::{Delta, Renderer, SetChange};

/// What `cali-wl-to-host` does with workload traffic to the host after egress policy allowed it
/// (Felix `DefaultEndpointToHostAction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointToHostAction {
    Accept,
    Drop,
    Return,
}

/// Whether a workload may send from the extra source prefixes its endpoint lists
/// (`allowSpoofedSourcePrefixes`); Felix `WorkloadSourceSpoofing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SourceSpoofing {
    /// Endpoints' allowed prefixes are ignored: every workload packet faces the strict RPF check.
    #[default]
    Disabled,
    /// A packet from a workload whose source lies in one of its endpoint's allowed prefixes skips
    /// the RPF check (raw `cali-rpf-skip`); policy still sees it.
    Any,
}

/// The NFQUEUE number DNS responses are held on unless configured otherwise.
pub const DEFAULT_DNS_QUEUE_NUM: u16 = 100;

/// Renderer configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderConfig {
    /// Bits the renderer may use for verdict marks (Felix `IptablesMarkMask`).
    pub mark_mask: u32,
    /// Workload interface prefixes (Felix `InterfacePrefix`); `cali` -> `cali+` wildcards.
    pub interface_prefixes: Vec<String>,
    /// `LOG` prefix for the Log action (sanitised, cut to 27 chars; the kernel allows 29 with ": ").
    pub log_prefix: String,
    /// How the Log action is rendered.
    pub log_action: LogAction,
    /// Felix `DefaultEndpointToHostAction` (calico.yaml sets ACCEPT).
    pub default_endpoint_to_host_action: EndpointToHostAction,
    /// Felix `AllowVXLANPacketsFromWorkloads` / `AllowIPIPPacketsFromWorkloads`.
    pub allow_encap_from_workloads: bool,
    /// Felix `WorkloadSourceSpoofing`: whether endpoints' `allowSpoofedSourcePrefixes` are honoured.
    pub workload_source_spoofing: SourceSpoofing,
    /// `MASQUERADE --random-fully` in `cali-nat-outgoing`: Felix adds it when iptables >= 1.6.2
    /// and the kernel >= 3.14 support it (its `MASQFullyRandom` feature); the agent detects it
    /// (`apply::detect_masquerade_fully_random`), the default (and `felixrs render`) assumes it.
    pub masquerade_random_fully: bool,
    /// Log denied packets via NFLOG (off by default, as in Felix without flow logs).
    pub deny_log: Option<DenyLog>,
    /// Felix's flow-log NFLOG rules on every verdict ([`DenyLog::FLOW_LOGS`]; the agent's
    /// `--flow-logs`); supersedes `deny_log` (no double log). Off by default.
    pub flow_logs: bool,
    /// Endpoints with the same tiers → policies and profiles (per direction) share one
    /// content-addressed policy chain (`cali-si-`/`cali-so-`); their own chains keep only the
    /// per-pod preamble and a goto. Off: Felix's inlined endpoint chains.
    pub share_chains: bool,
    /// DNS servers whose responses to local workloads are held (NFQUEUE) until the learner has
    /// put their addresses into the domain sets (FQDN policy, issue 16). Per family, only when
    /// servers of that family are listed: mangle `cali-POSTROUTING` queues their UDP and TCP
    /// responses (`-s <server> --sport <port>`) towards workload interfaces. Empty: nothing is
    /// queued (and so nothing learned).
    pub dns_trusted_servers: Vec<SocketAddr>,
    /// The NFQUEUE number the learner binds (`--dns-queue-num`, default 100).
    pub dns_queue_num: u16,
    /// Felix `FailsafeInboundHostPorts`: accepted into the host on every host endpoint before
    /// any host policy (`cali-failsafe-in`); empty: none. Default Felix's ([`host::default_inbound`]).
    pub failsafe_inbound: Vec<host::FailsafePort>,
    /// Felix `FailsafeOutboundHostPorts` (`cali-failsafe-out`); default Felix's.
    pub failsafe_outbound: Vec<host::FailsafePort>,
}

impl RenderConfig {
    /// The NFLOG verdict logging the chains get: flow logs when on, else `deny_log`.
    pub fn verdict_log(&self) -> Option<DenyLog> {
        if self.flow_logs {
            Some(DenyLog::FLOW_LOGS)
        } else {
            self.deny_log
        }
    }
}

impl Default for RenderConfig {
    fn default() -> Self {
        RenderConfig {
            mark_mask: 0xffff_0000,
            interface_prefixes: vec!["cali".into()],
            log_prefix: "calico-packet".into(),
            log_action: LogAction::Log,
            default_endpoint_to_host_action: EndpointToHostAction::Accept,
            allow_encap_from_workloads: false,
            workload_source_spoofing: SourceSpoofing::Disabled,
            masquerade_random_fully: true,
            deny_log: None,
            flow_logs: false,
            share_chains: true,
            dns_trusted_servers: Vec::new(),
            dns_queue_num: DEFAULT_DNS_QUEUE_NUM,
            failsafe_inbound: host::default_inbound(),
            failsafe_outbound: host::default_outbound(),
        }
    }
}

/// Errors of the renderer. Each names the object and field that failed; a failing object is
/// rendered fail-closed (or left out, so that its interface hits "Unknown interface" DROP) and
/// never stops the others.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error(
        "mark mask {mask:#x} has fewer than 5 bits (need accept, pass, drop, scratch0, scratch1)"
    )]
    MarkMaskTooSmall { mask: u32 },
    #[error("invalid interface prefix {prefix:?}: must be 1-14 characters of [A-Za-z0-9._-]")]
    InvalidInterfacePrefix { prefix: String },
    #[error(
        "endpoint {endpoint}: invalid interfaceName {iface:?}: must be 1-15 characters of [A-Za-z0-9._-]"
    )]
    InvalidInterface {
        endpoint: Box<EndpointId>,
        iface: String,
    },
    #[error(
        "host endpoint {endpoint}: invalid interfaceName {iface:?}: must be \"*\" or 1-15 characters of [A-Za-z0-9._-]"
    )]
    InvalidHostInterface { endpoint: String, iface: String },
    #[error("endpoint {endpoint}: interfaceName {iface:?} is already used by endpoint {other}")]
    DuplicateInterface {
        endpoint: Box<EndpointId>,
        iface: String,
        other: Box<EndpointId>,
    },
    #[error("ip set {id:?}: invalid id (expected [A-Za-z0-9:_.-])")]
    InvalidIpSetId { id: String },
    #[error("ip set {id:?}: member {member} does not fit a {kind} set")]
    InvalidIpSetMember {
        id: String,
        member: String,
        kind: &'static str,
    },
    #[error("ip set {id:?}: members changed before the set was created")]
    UnknownIpSet { id: String },
    #[error("{policy} {direction}: {reason}; dropping all its traffic")]
    Policy {
        policy: Box<PolicyId>,
        direction: &'static str,
        reason: Box<RuleError>,
    },
    #[error("profile {profile} {direction}: {reason}; dropping all its traffic")]
    Profile {
        profile: String,
        direction: &'static str,
        reason: Box<RuleError>,
    },
}
