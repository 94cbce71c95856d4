//! Calico `projectcalico.org/v3` resources, their etcd keys and validation.
//!
//! * [`Resource`] is one decoded resource of any supported [`Kind`]; [`ResourceKey`] is its
//!   identity and etcd key (`/calico/resources/v3/projectcalico.org/<plural>/[<ns>/]<name>`).
//! * Decoding ([`Resource::from_json`], [`Resource::from_etcd`]) checks shape only: JSON types,
//!   enum values, CIDR and port syntax. A decode error names the resource and the JSON path of the
//!   bad field. Everything semantic (names, selectors, port/protocol combinations, IP versions,
//!   labels) is [`Resource::validate`], which returns every problem at once.
//! * Serialisation ([`Resource::to_json`]) is canonical: `apiVersion`, `kind`, `metadata`,
//!   `spec` in that order, maps sorted, empty fields omitted as Go's `omitempty` does, CIDRs as
//!   `addr/len` (a bare address in `nets` decodes as a host network and re-encodes with its
//!   prefix length; host bits are kept as written, the graph masks them).
//! * Strict: every field of a document is checked against the upstream schema ([`schema`]). An
//!   unknown field inside a policy's or profile's rule (`spec.ingress[0].source.selectr`) is kept
//!   on that [`Rule`] (`unknown_fields`) and the rule fails safe, like a rule with a field of
//!   [`UNENFORCED_RULE_FIELDS`]; an unknown field anywhere else rejects the resource
//!   ([`ModelError::UnknownFields`], naming every path). Unknown fields are never preserved.
//! * `Resource` also implements serde's `Serialize`/`Deserialize` with the same canonical form
//!   and kind dispatch, so `serde_yaml::from_str::<Resource>` reads a Calico manifest.
//! * Decode-time vs validation-time: a malformed CIDR, port, protocol, action or type fails the
//!   decode (with its JSON path) because the typed field cannot hold it; the resource is
//!   rejected either way, and `ResourceKey::parse_etcd_key` still names it for the caller.
//!
//! Invariant: for a resource that decodes, `from_json(to_json(r)) == r`.

pub mod domain;
pub mod endpoint;
mod error;
mod felixconfig;
pub mod ippool;
mod key;
pub mod metadata;
mod names;
pub mod netset;
pub mod policy;
mod prefix;
pub mod primitives;
pub mod profile;
mod remote;
mod resource;
pub mod rule;
pub mod schema;
pub mod tier;
mod validate;

pub use domain::{DomainError, DomainPattern};
pub use endpoint::{
    EndpointPort, HostEndpoint, HostEndpointSpec, IpNat, WorkloadEndpoint, WorkloadEndpointSpec,
};
pub use error::{ModelError, ValidationError};
pub use felixconfig::{
    DurationError, FELIX_CONFIGURATION_PLURAL, FelixConfiguration, FelixConfigurationError,
    GLOBAL_FELIX_CONFIGURATION, felix_configuration_key, felix_configuration_name,
    node_felix_configuration, parse_duration,
};
pub use ippool::{AllowedUse, AssignmentMode, EncapMode, IpPool, IpPoolSpec};
pub use key::{API_VERSION, CALICO_PREFIX, Kind, ResourceKey};
pub use metadata::{InvalidCidr, Metadata, parse_net};
pub use names::{
    K8S_ADMIN_POLICY_PREFIXES, NameError, validate_container_id,
    validate_global_network_policy_name, validate_identifier, validate_interface_name,
    validate_label_key, validate_label_value, validate_mac, validate_name, validate_named_port,
    validate_namespace, validate_network_policy_name, validate_tier_name,
};
pub use netset::{GlobalNetworkSet, NetworkSet, NetworkSetSpec};
pub use policy::{
    GlobalNetworkPolicy, NetworkPolicy, PolicySpec, PolicyType, StagedAction,
    StagedGlobalNetworkPolicy, StagedKubernetesNetworkPolicy, StagedKubernetesNetworkPolicySpec,
    StagedNetworkPolicy, StagedPolicySpec,
};
pub use prefix::{DEFAULT_ETCD_PREFIX, EtcdPrefix, EtcdPrefixError};
pub use primitives::{Action, IcmpFields, IpVersion, Port, PrimitiveError, Protocol};
pub use profile::{DEFAULT_ALLOW_PROFILE, Profile, ProfileSpec};
pub use remote::{
    REMOTE_CLUSTER_PLURAL, RemoteCluster, RemoteClusterError, remote_cluster_key,
    remote_cluster_name,
};
pub use resource::{Resource, Validated};
pub use rule::{
    EntityRule, HttpMatch, HttpPath, Rule, RuleMetadata, ServiceAccountMatch, ServiceMatch,
    UNENFORCED_RULE_FIELDS,
};
pub use tier::{DEFAULT_TIER, KUBE_ADMIN_TIER, KUBE_BASELINE_TIER, Tier, TierSpec};
