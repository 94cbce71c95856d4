//! The calculation graph's output: what the dataplane (renderer + applier) needs, and nothing else.
//!
//! This is the contract between `calc_graph::graph` (producer) and `iptables::render` (consumer), in
//! the spirit of Felix's `proto` package. Selectors and named ports never reach the dataplane: the
//! graph has already replaced them with IP set ids, so the renderer needs no selector logic.
//!
//! Ordering guarantee of a flushed batch (see `graph`): `IpSetCreated` / `DomainSetCreated` /
//! member deltas, then
//! `PolicyUpdated`, then `ProfileUpdated`, then `EndpointUpdated` / `HostEndpointUpdated`; then
//! removals in reverse: `EndpointRemoved` / `HostEndpointRemoved`, `ProfileRemoved`, `PolicyRemoved`, `IpSetRemoved`; then `IpPoolUpdated` /
//! `IpPoolRemoved` (as Felix sends IP-pool updates after the policy state); `InSync` last (once).
//! Nothing references an IP set, policy or profile that an earlier output has not created; pools
//! reference nothing (the dataplane derives its all-pools / masquerade-pools sets from them).
//!
//! Domain sets (`d:<hash>`, FQDN policy) follow the same rule: a `DomainSetCreated` comes in the
//! creation group, before any `PolicyUpdated`/`ProfileUpdated` whose rules name it in
//! `dst_domain_ip_set_ids`, and its `IpSetRemoved` comes after the last policy or profile that
//! referenced it was updated or removed. The graph never sends members for a domain set (the
//! agent's DNS learner owns them); it only sends the patterns it stands for.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

pub use crate::model::DomainPattern;
pub use crate::model::primitives::{Action, IcmpFields, IpVersion, Protocol};

/// An IP set id as Felix computes it: `s:<hash>` for a selector set, `n:<hash>` for a named-port
/// set (see the graph's `ipset_id` helpers), `d:<hash>` for a domain set (FQDN policy). The dataplane turns it into kernel set names
/// `cali40<id>` / `cali60<id>` cut to 31 characters.
pub type IpSetId = String;

/// The kind of kernel set an IP set id needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpSetKind {
    /// `hash:net`: endpoint addresses (/32, /128) and network-set CIDRs.
    Net,
    /// `hash:ip,port`: named-port members (`10.0.0.5,tcp:8080`).
    IpPort,
    /// `hash:ip ... timeout 0`: addresses learned from DNS for a rule's `destination.domains`,
    /// each with its own timeout. The graph knows only the patterns ([`Output::DomainSetCreated`]).
    Domain,
}

/// A member of an IP set. Both families live in one logical set; the dataplane splits them into
/// the v4 and v6 kernel sets.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpSetMember {
    Net(IpNet),
    IpPort {
        addr: IpAddr,
        protocol: Protocol,
        port: u16,
    },
}

impl IpSetMember {
    pub fn is_ipv6(&self) -> bool {
        match self {
            IpSetMember::Net(n) => matches!(n, IpNet::V6(_)),
            IpSetMember::IpPort { addr, .. } => addr.is_ipv6(),
        }
    }
}

/// An inclusive port range; a single port is `first == last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    /// One port.
    pub const fn single(p: u16) -> Self {
        PortRange { first: p, last: p }
    }

    /// `first` to `last`, inclusive.
    pub const fn range(first: u16, last: u16) -> Self {
        PortRange { first, last }
    }
}

impl fmt::Display for PortRange {
    /// `80` or `80:90`, the multiport syntax.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}:{}", self.first, self.last)
        }
    }
}

/// A rule with selectors and named ports resolved to IP set ids (Felix's `proto.Rule`).
///
/// Within one field the entries are OR-ed (any source net, any port); the fields are AND-ed.
/// `not_*` fields match when none of their entries match. `src_ip_set_ids` already combines the
/// rule's selector, namespaceSelector and serviceAccounts into one selector per side.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ParsedRule {
    pub action: Option<Action>,
    pub ip_version: Option<IpVersion>,
    pub protocol: Option<Protocol>,
    pub not_protocol: Option<Protocol>,
    pub icmp: Option<IcmpFields>,
    pub not_icmp: Option<IcmpFields>,

    pub src_nets: Vec<IpNet>,
    pub not_src_nets: Vec<IpNet>,
    pub src_ports: Vec<PortRange>,
    pub not_src_ports: Vec<PortRange>,
    pub src_named_port_ip_set_ids: Vec<IpSetId>,
    pub not_src_named_port_ip_set_ids: Vec<IpSetId>,
    pub src_ip_set_ids: Vec<IpSetId>,
    pub not_src_ip_set_ids: Vec<IpSetId>,

    pub dst_nets: Vec<IpNet>,
    pub not_dst_nets: Vec<IpNet>,
    pub dst_ports: Vec<PortRange>,
    pub not_dst_ports: Vec<PortRange>,
    pub dst_named_port_ip_set_ids: Vec<IpSetId>,
    pub not_dst_named_port_ip_set_ids: Vec<IpSetId>,
    pub dst_ip_set_ids: Vec<IpSetId>,
    pub not_dst_ip_set_ids: Vec<IpSetId>,
    /// `destination.domains`: the destination is in one of these domain sets (`d:<hash>`; the
    /// graph emits at most one per rule, and never together with `dst_nets` or `dst_ip_set_ids`).
    pub dst_domain_ip_set_ids: Vec<IpSetId>,

    /// `metadata.annotations` of the rule, rendered as `key=value` comments.
    pub annotations: Vec<(String, String)>,
}

impl ParsedRule {
    /// The action, defaulting as Calico does (an absent action is Allow).
    pub fn action(&self) -> Action {
        self.action.unwrap_or(Action::Allow)
    }
}

/// Which API kind a policy came from; decides the short kind in chain ids (`np`, `gnp`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PolicyKind {
    NetworkPolicy,
    GlobalNetworkPolicy,
    /// Staged kinds (Calico's pending policies): active so the staged view can be evaluated,
    /// never programmed by the enforced renderer.
    StagedNetworkPolicy,
    StagedGlobalNetworkPolicy,
    StagedKubernetesNetworkPolicy,
}

impl PolicyKind {
    /// The kind as the datastore names it (`NetworkPolicy`, `StagedGlobalNetworkPolicy`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::NetworkPolicy => "NetworkPolicy",
            PolicyKind::GlobalNetworkPolicy => "GlobalNetworkPolicy",
            PolicyKind::StagedNetworkPolicy => "StagedNetworkPolicy",
            PolicyKind::StagedGlobalNetworkPolicy => "StagedGlobalNetworkPolicy",
            PolicyKind::StagedKubernetesNetworkPolicy => "StagedKubernetesNetworkPolicy",
        }
    }

    /// Whether this is a staged kind: evaluated in the staged view only, never enforced.
    pub fn is_staged(self) -> bool {
        !matches!(
            self,
            PolicyKind::NetworkPolicy | PolicyKind::GlobalNetworkPolicy
        )
    }
}

/// Identity of a policy. `namespace` is `Some` exactly for namespaced kinds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyId {
    pub kind: PolicyKind,
    pub tier: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl fmt::Display for PolicyId {
    /// Human form used in logs and chain comments: `NetworkPolicy prod/web`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = self.kind.as_str();
        match &self.namespace {
            Some(ns) => write!(f, "{kind} {ns}/{}", self.name),
            None => write!(f, "{kind} {}", self.name),
        }
    }
}

/// A policy that applies to at least one local endpoint, with its rules resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ActivePolicy {
    pub id: PolicyId,
    pub order: Option<f64>,
    pub inbound_rules: Vec<ParsedRule>,
    pub outbound_rules: Vec<ParsedRule>,
    pub untracked: bool,
    pub pre_dnat: bool,
    pub apply_on_forward: bool,
}

/// A profile named by at least one local endpoint (`kns.<ns>`, `ksa.<ns>.<sa>`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct ActiveProfile {
    pub id: String,
    pub inbound_rules: Vec<ParsedRule>,
    pub outbound_rules: Vec<ParsedRule>,
}

/// One tier's slice of an endpoint's policy list, in evaluation order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierInfo {
    pub name: String,
    /// What happens to traffic that no policy in this tier decided: `Deny` (the default tier and
    /// most tiers) or `Pass`.
    pub default_action: Action,
    pub ingress_policies: Vec<PolicyId>,
    pub egress_policies: Vec<PolicyId>,
}

/// Identity of a local workload endpoint: its namespace and WorkloadEndpoint name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointId {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for EndpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A workload endpoint on this node, with everything the dataplane needs to program it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalEndpoint {
    pub id: EndpointId,
    /// Host-side interface name, e.g. `calic440f455693`.
    pub interface_name: String,
    pub ipv4_nets: Vec<IpNet>,
    pub ipv6_nets: Vec<IpNet>,
    /// Normal (tracked, post-DNAT) tiers that have at least one policy for this endpoint, in order.
    pub tiers: Vec<TierInfo>,
    /// Profile ids in the endpoint's order; a profile that does not exist is still listed and the
    /// graph emits a deny-all `ActiveProfile` for it (fail closed, as Felix does).
    pub profile_ids: Vec<String>,
    /// Source prefixes the endpoint may send from besides its own addresses (WorkloadEndpoint
    /// `allowSpoofedSourcePrefixes`, from the pod annotation `cni.projectcalico.org/allowedSourcePrefixes`),
    /// host bits cleared, in the resource's order. The dataplane honours them only when the node
    /// allows workload source spoofing (Felix `WorkloadSourceSpoofing=Any`).
    pub allow_spoofed_source_prefixes: Vec<IpNet>,
    /// The staged view (Calico's pending policies): the tiers as if every staged policy were
    /// enforced in its tier and order, a staged Set policy replacing the enforced policy it
    /// shadows, a staged Delete removing it. `None` when no staged policy changes this
    /// endpoint's view. The enforced renderer never reads it.
    pub staged_tiers: Option<Vec<TierInfo>>,
}

/// The interface name of a host endpoint that applies to all of the host's interfaces
/// (`interfaceName: "*"`).
pub const ALL_INTERFACES: &str = "*";

/// The interface name of a host endpoint without `interfaceName`: it applies to every host
/// interface that carries one of its `expectedIPs` (resolved by the dataplane, as Felix's).
pub const BY_EXPECTED_IPS: &str = "";

/// A host endpoint of this node (Felix's `proto.HostEndpoint`): a named host interface, or
/// [`ALL_INTERFACES`], with its policies split as Felix splits them. Keyed by the HostEndpoint
/// resource's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalHostEndpoint {
    /// The HostEndpoint resource's name.
    pub name: String,
    /// The host interface (`eth0`), [`ALL_INTERFACES`] or [`BY_EXPECTED_IPS`].
    pub interface_name: String,
    /// `expectedIPs` of the family (the filter table matches on the interface; with
    /// [`BY_EXPECTED_IPS`] they choose the interfaces).
    pub ipv4_addrs: Vec<IpAddr>,
    pub ipv6_addrs: Vec<IpAddr>,
    /// Normal (tracked, post-DNAT) policies: host traffic in (`cali-fh-`) and out (`cali-th-`).
    pub tiers: Vec<TierInfo>,
    /// The normal policies with `applyOnForward`: forwarded traffic through the interface
    /// (`cali-fhfw-`/`cali-thfw-`).
    pub forward_tiers: Vec<TierInfo>,
    /// `doNotTrack` policies (raw table; not rendered yet).
    pub untracked_tiers: Vec<TierInfo>,
    /// `preDNAT` policies, ingress only (mangle table; not rendered yet).
    pub pre_dnat_tiers: Vec<TierInfo>,
    /// Profile ids in the endpoint's order (a missing one is a deny-all `ActiveProfile`).
    pub profile_ids: Vec<String>,
}

impl LocalHostEndpoint {
    /// Whether this endpoint applies to all interfaces (`interfaceName: "*"`).
    pub fn is_all_interfaces(&self) -> bool {
        self.interface_name == ALL_INTERFACES
    }

    /// Whether this endpoint is resolved by `expectedIPs` (no `interfaceName`).
    pub fn is_by_expected_ips(&self) -> bool {
        self.interface_name == BY_EXPECTED_IPS
    }

    /// Every policy any of its tier lists names.
    pub fn policy_ids(&self) -> impl Iterator<Item = &PolicyId> {
        [
            &self.tiers,
            &self.forward_tiers,
            &self.untracked_tiers,
            &self.pre_dnat_tiers,
        ]
        .into_iter()
        .flatten()
        .flat_map(|t| t.ingress_policies.iter().chain(&t.egress_policies))
    }
}

/// An IP pool as the dataplane needs it (Felix's `proto.IPAMPool`): the nat table masquerades
/// traffic from a `masquerade` pool to destinations outside every pool. Disabled pools are
/// included (disabling only stops new allocations); `load_balancer_only` pools hold no pod
/// addresses and are left out of the all-pools set.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpPool {
    /// The IPPool resource's name.
    pub name: String,
    /// The pool's CIDR (validated: no host bits).
    pub cidr: IpNet,
    /// `natOutgoing`.
    pub masquerade: bool,
    /// `allowedUses: [LoadBalancer]`.
    pub load_balancer_only: bool,
}

/// One output of the calculation graph. See the module docs for batch ordering.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    IpSetCreated {
        id: IpSetId,
        kind: IpSetKind,
        /// Every member, sorted. Shared with the graph's own copy, so emitting (or cloning) a large
        /// set is a reference count, not a copy.
        members: Arc<[IpSetMember]>,
    },
    /// A domain set (`d:<hash>`, kind [`IpSetKind::Domain`]) some active rule references: the
    /// sorted, deduplicated, normalised patterns it stands for. Its addresses are learned from
    /// DNS by the agent, never sent by the graph; it is removed with [`Output::IpSetRemoved`].
    DomainSetCreated {
        id: IpSetId,
        patterns: Arc<[DomainPattern]>,
    },
    IpSetMembersAdded {
        id: IpSetId,
        members: Vec<IpSetMember>,
    },
    IpSetMembersRemoved {
        id: IpSetId,
        members: Vec<IpSetMember>,
    },
    PolicyUpdated(ActivePolicy),
    ProfileUpdated(ActiveProfile),
    EndpointUpdated(LocalEndpoint),
    /// A host endpoint of this node was created or changed (same group as `EndpointUpdated`,
    /// after the workload endpoints).
    HostEndpointUpdated(LocalHostEndpoint),
    EndpointRemoved(EndpointId),
    /// A host endpoint (by name) went away (same group as `EndpointRemoved`, after them).
    HostEndpointRemoved(String),
    ProfileRemoved(String),
    PolicyRemoved(PolicyId),
    IpSetRemoved(IpSetId),
    /// An IP pool was created or changed (keyed by name).
    IpPoolUpdated(IpPool),
    /// An IP pool was deleted (or became invalid).
    IpPoolRemoved(String),
    /// The datastore's initial snapshot has been fully processed; emitted once, at the end of the
    /// first batch flushed after the `InSync` input.
    InSync,
}
