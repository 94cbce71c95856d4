//! The known-field schema of every document felixrs decodes, and the check that finds the fields
//! a document has and the schema does not.
//!
//! serde's `deny_unknown_fields` cannot be used: it does not work with `#[serde(flatten)]` (the
//! staged policy specs and the output envelope use it), and it stops at the first unknown field
//! without the information to fail a single rule safe. So decoding is two passes over the same
//! bytes: the typed serde decode, and [`unknown_fields`], a streaming walk (no tree is built, no
//! allocation unless a field is unknown) that compares every object key with this schema and
//! returns the JSON path (`spec.ingress[0].source.selectr`) of each key it does not know. The
//! decode's head (`apiVersion`, `kind`) is read in that same walk when `kind` comes first
//! ([`head_and_unknown_paths`]), so a Calico document is read twice, not three times.
//!
//! The schema lists every field of the upstream types we claim (`projectcalico/api`
//! `pkg/apis/projectcalico/v3`, libcalico-go's WorkloadEndpoint, Kubernetes `ObjectMeta`, and
//! `networking.k8s.io/v1` NetworkPolicy for the controller and `StagedKubernetesNetworkPolicy`),
//! whether or not we enforce it: a valid upstream object never has an unknown field. Which known
//! fields are not enforced is a different list, kept in one place:
//! [`super::rule::UNENFORCED_RULE_FIELDS`].
//!
//! Where values are free-form (labels, annotations, `managedFields`, `status`) the schema says
//! [`Shape::Any`] and the walk does not look inside.

use std::fmt;

use serde::Deserializer;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// What a JSON value is expected to look like, as far as field names go. Types of scalars are the
/// typed decode's business.
#[derive(Debug)]
pub enum Shape {
    /// Anything; not looked into.
    Any,
    /// An object with exactly these fields (the union of the groups; a group per Go struct, so
    /// embedded/flattened structs compose).
    Object(&'static [&'static [Field]]),
    /// A list whose entries have this shape.
    List(&'static Shape),
    /// An object with arbitrary keys whose values have this shape.
    Map(&'static Shape),
}

/// One known field: its JSON name and shape.
#[derive(Debug)]
pub struct Field(pub &'static str, pub &'static Shape);

const ANY: &Shape = &Shape::Any;

// --- shared pieces -----------------------------------------------------------------------------

/// Kubernetes `ObjectMeta` (every field of `metav1.ObjectMeta`, plus the long-gone
/// `clusterName` older objects may still carry).
const OBJECT_META_FIELDS: &[Field] = &[
    Field("name", ANY),
    Field("generateName", ANY),
    Field("namespace", ANY),
    Field("selfLink", ANY),
    Field("uid", ANY),
    Field("resourceVersion", ANY),
    Field("generation", ANY),
    Field("creationTimestamp", ANY),
    Field("deletionTimestamp", ANY),
    Field("deletionGracePeriodSeconds", ANY),
    Field("labels", ANY),
    Field("annotations", ANY),
    Field("ownerReferences", ANY),
    Field("finalizers", ANY),
    Field("managedFields", ANY),
    Field("clusterName", ANY),
];
pub static OBJECT_META: Shape = Shape::Object(&[OBJECT_META_FIELDS]);

/// `apiVersion`, `kind`, `metadata` (and `status`, which Calico's API server may add and nothing
/// here reads).
const fn envelope(spec: &'static Shape) -> [Field; 5] {
    [
        Field("apiVersion", ANY),
        Field("kind", ANY),
        Field("metadata", &OBJECT_META),
        Field("spec", spec),
        Field("status", ANY),
    ]
}

// --- Calico v3 rules ---------------------------------------------------------------------------

static ICMP: Shape = Shape::Object(&[&[Field("type", ANY), Field("code", ANY)]]);
static SERVICE_ACCOUNT_MATCH: Shape =
    Shape::Object(&[&[Field("names", ANY), Field("selector", ANY)]]);
static SERVICE_MATCH: Shape = Shape::Object(&[&[Field("name", ANY), Field("namespace", ANY)]]);
static HTTP_PATH: Shape = Shape::Object(&[&[Field("exact", ANY), Field("prefix", ANY)]]);
static HTTP_MATCH: Shape = Shape::Object(&[&[
    Field("methods", ANY),
    Field("paths", &Shape::List(&HTTP_PATH)),
]]);
static RULE_METADATA: Shape = Shape::Object(&[&[Field("annotations", ANY)]]);

/// `EntityRule`; `domains` is Calico Enterprise's (DNS policy), known so that it fails safe.
pub static ENTITY_RULE: Shape = Shape::Object(&[&[
    Field("nets", ANY),
    Field("notNets", ANY),
    Field("selector", ANY),
    Field("notSelector", ANY),
    Field("namespaceSelector", ANY),
    Field("ports", ANY),
    Field("notPorts", ANY),
    Field("serviceAccounts", &SERVICE_ACCOUNT_MATCH),
    Field("services", &SERVICE_MATCH),
    Field("domains", ANY),
]]);

/// `Rule`.
pub static RULE: Shape = Shape::Object(&[&[
    Field("action", ANY),
    Field("ipVersion", ANY),
    Field("protocol", ANY),
    Field("notProtocol", ANY),
    Field("icmp", &ICMP),
    Field("notICMP", &ICMP),
    Field("source", &ENTITY_RULE),
    Field("destination", &ENTITY_RULE),
    Field("http", &HTTP_MATCH),
    Field("metadata", &RULE_METADATA),
]]);
static RULES: Shape = Shape::List(&RULE);

// --- Calico v3 kinds ---------------------------------------------------------------------------

const NETWORK_POLICY_SPEC_FIELDS: &[Field] = &[
    Field("tier", ANY),
    Field("order", ANY),
    Field("ingress", &RULES),
    Field("egress", &RULES),
    Field("selector", ANY),
    Field("types", ANY),
    Field("serviceAccountSelector", ANY),
    Field("performanceHints", ANY),
];
const GLOBAL_ONLY_SPEC_FIELDS: &[Field] = &[
    Field("doNotTrack", ANY),
    Field("preDNAT", ANY),
    Field("applyOnForward", ANY),
    Field("namespaceSelector", ANY),
];
const STAGED_FIELDS: &[Field] = &[Field("stagedAction", ANY)];

static NETWORK_POLICY_SPEC: Shape = Shape::Object(&[NETWORK_POLICY_SPEC_FIELDS]);
static GLOBAL_NETWORK_POLICY_SPEC: Shape =
    Shape::Object(&[NETWORK_POLICY_SPEC_FIELDS, GLOBAL_ONLY_SPEC_FIELDS]);
static STAGED_NETWORK_POLICY_SPEC: Shape =
    Shape::Object(&[NETWORK_POLICY_SPEC_FIELDS, STAGED_FIELDS]);
static STAGED_GLOBAL_NETWORK_POLICY_SPEC: Shape = Shape::Object(&[
    NETWORK_POLICY_SPEC_FIELDS,
    GLOBAL_ONLY_SPEC_FIELDS,
    STAGED_FIELDS,
]);
static STAGED_KUBERNETES_NETWORK_POLICY_SPEC: Shape =
    Shape::Object(&[K8S_NETWORK_POLICY_SPEC_FIELDS, STAGED_FIELDS]);
static TIER_SPEC: Shape = Shape::Object(&[&[Field("order", ANY), Field("defaultAction", ANY)]]);
static PROFILE_SPEC: Shape = Shape::Object(&[&[
    Field("ingress", &RULES),
    Field("egress", &RULES),
    Field("labelsToApply", ANY),
]]);
static NETWORK_SET_SPEC: Shape = Shape::Object(&[&[Field("nets", ANY)]]);
static ENDPOINT_PORT: Shape = Shape::Object(&[&[
    Field("name", ANY),
    Field("protocol", ANY),
    Field("port", ANY),
    Field("hostPort", ANY),
    Field("hostIP", ANY),
]]);
static IP_NAT: Shape = Shape::Object(&[&[Field("internalIP", ANY), Field("externalIP", ANY)]]);
static WORKLOAD_ENDPOINT_SPEC: Shape = Shape::Object(&[&[
    Field("orchestrator", ANY),
    Field("workload", ANY),
    Field("node", ANY),
    Field("containerID", ANY),
    Field("pod", ANY),
    Field("endpoint", ANY),
    Field("serviceAccountName", ANY),
    Field("ipNetworks", ANY),
    Field("ipNATs", &Shape::List(&IP_NAT)),
    Field("ipv4Gateway", ANY),
    Field("ipv6Gateway", ANY),
    Field("profiles", ANY),
    Field("interfaceName", ANY),
    Field("mac", ANY),
    Field("ports", &Shape::List(&ENDPOINT_PORT)),
    Field("allowSpoofedSourcePrefixes", ANY),
    // libcalico-go's later additions: QoS limits and the pod's own QoS policy references.
    Field("qosControls", ANY),
    Field("qosPolicies", ANY),
]]);
static HOST_ENDPOINT_SPEC: Shape = Shape::Object(&[&[
    Field("node", ANY),
    Field("interfaceName", ANY),
    Field("expectedIPs", ANY),
    Field("profiles", ANY),
    Field("ports", &Shape::List(&ENDPOINT_PORT)),
]]);

static IPIP_CONFIGURATION: Shape = Shape::Object(&[&[Field("enabled", ANY), Field("mode", ANY)]]);
/// `IPPoolSpec`, with the deprecated v1-compatible `ipip` block and `nat-outgoing` spelling.
static IP_POOL_SPEC: Shape = Shape::Object(&[&[
    Field("cidr", ANY),
    Field("vxlanMode", ANY),
    Field("ipipMode", ANY),
    Field("natOutgoing", ANY),
    Field("disabled", ANY),
    Field("disableBGPExport", ANY),
    Field("blockSize", ANY),
    Field("nodeSelector", ANY),
    Field("namespaceSelector", ANY),
    Field("allowedUses", ANY),
    Field("assignmentMode", ANY),
    Field("ipip", &IPIP_CONFIGURATION),
    Field("nat-outgoing", ANY),
]]);

macro_rules! document {
    ($name:ident, $spec:expr) => {
        static $name: Shape = Shape::Object(&[&envelope(&$spec)]);
    };
}
document!(NETWORK_POLICY_DOC, NETWORK_POLICY_SPEC);
document!(GLOBAL_NETWORK_POLICY_DOC, GLOBAL_NETWORK_POLICY_SPEC);
document!(STAGED_NETWORK_POLICY_DOC, STAGED_NETWORK_POLICY_SPEC);
document!(
    STAGED_GLOBAL_NETWORK_POLICY_DOC,
    STAGED_GLOBAL_NETWORK_POLICY_SPEC
);
document!(
    STAGED_KUBERNETES_NETWORK_POLICY_DOC,
    STAGED_KUBERNETES_NETWORK_POLICY_SPEC
);
document!(TIER_DOC, TIER_SPEC);
document!(PROFILE_DOC, PROFILE_SPEC);
document!(NETWORK_SET_DOC, NETWORK_SET_SPEC);
document!(WORKLOAD_ENDPOINT_DOC, WORKLOAD_ENDPOINT_SPEC);
document!(HOST_ENDPOINT_DOC, HOST_ENDPOINT_SPEC);
document!(IP_POOL_DOC, IP_POOL_SPEC);

/// The schema of a Calico v3 document of `kind`.
pub fn calico_document(kind: super::Kind) -> &'static Shape {
    use super::Kind as K;
    match kind {
        K::NetworkPolicy => &NETWORK_POLICY_DOC,
        K::GlobalNetworkPolicy => &GLOBAL_NETWORK_POLICY_DOC,
        K::StagedNetworkPolicy => &STAGED_NETWORK_POLICY_DOC,
        K::StagedGlobalNetworkPolicy => &STAGED_GLOBAL_NETWORK_POLICY_DOC,
        K::StagedKubernetesNetworkPolicy => &STAGED_KUBERNETES_NETWORK_POLICY_DOC,
        K::Tier => &TIER_DOC,
        K::Profile => &PROFILE_DOC,
        K::NetworkSet | K::GlobalNetworkSet => &NETWORK_SET_DOC,
        K::WorkloadEndpoint => &WORKLOAD_ENDPOINT_DOC,
        K::HostEndpoint => &HOST_ENDPOINT_DOC,
        K::IpPool => &IP_POOL_DOC,
    }
}

// --- networking.k8s.io/v1 NetworkPolicy --------------------------------------------------------

static LABEL_SELECTOR_REQUIREMENT: Shape = Shape::Object(&[&[
    Field("key", ANY),
    Field("operator", ANY),
    Field("values", ANY),
]]);
/// `metav1.LabelSelector`.
pub static LABEL_SELECTOR: Shape = Shape::Object(&[&[
    Field("matchLabels", ANY),
    Field(
        "matchExpressions",
        &Shape::List(&LABEL_SELECTOR_REQUIREMENT),
    ),
]]);
static K8S_IP_BLOCK: Shape = Shape::Object(&[&[Field("cidr", ANY), Field("except", ANY)]]);
static K8S_PEER: Shape = Shape::Object(&[&[
    Field("podSelector", &LABEL_SELECTOR),
    Field("namespaceSelector", &LABEL_SELECTOR),
    Field("ipBlock", &K8S_IP_BLOCK),
]]);
static K8S_PORT: Shape = Shape::Object(&[&[
    Field("protocol", ANY),
    Field("port", ANY),
    Field("endPort", ANY),
]]);
static K8S_INGRESS_RULE: Shape = Shape::Object(&[&[
    Field("ports", &Shape::List(&K8S_PORT)),
    Field("from", &Shape::List(&K8S_PEER)),
]]);
static K8S_EGRESS_RULE: Shape = Shape::Object(&[&[
    Field("ports", &Shape::List(&K8S_PORT)),
    Field("to", &Shape::List(&K8S_PEER)),
]]);
const K8S_NETWORK_POLICY_SPEC_FIELDS: &[Field] = &[
    Field("podSelector", &LABEL_SELECTOR),
    Field("ingress", &Shape::List(&K8S_INGRESS_RULE)),
    Field("egress", &Shape::List(&K8S_EGRESS_RULE)),
    Field("policyTypes", ANY),
];
static K8S_NETWORK_POLICY_SPEC: Shape = Shape::Object(&[K8S_NETWORK_POLICY_SPEC_FIELDS]);
/// A `networking.k8s.io/v1` NetworkPolicy document (`status` was removed upstream but old
/// servers may still send it).
pub static K8S_NETWORK_POLICY: Shape = Shape::Object(&[&envelope(&K8S_NETWORK_POLICY_SPEC)]);

// --- the check ---------------------------------------------------------------------------------

/// The JSON paths (`spec.ingress[0].source.selectr`) of every object key in `json` that `shape`
/// does not know, in document order. Malformed JSON yields no paths: the typed decode reports it.
pub fn unknown_fields(shape: &'static Shape, json: &[u8]) -> Vec<String> {
    unknown_field_paths(shape, json)
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// [`unknown_fields`], as structured paths (a key that itself contains `.` or `[` cannot be
/// mistaken for a deeper path).
pub fn unknown_field_paths(shape: &'static Shape, json: &[u8]) -> Vec<FieldPath> {
    let mut out = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(json);
    let _ = Check {
        shape,
        at: &Seg::Root,
        out: &mut out,
    }
    .deserialize(&mut de);
    out
}

/// [`unknown_fields`] of an already-parsed value.
pub fn unknown_fields_in_value(shape: &'static Shape, v: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    let _ = Check {
        shape,
        at: &Seg::Root,
        out: &mut out,
    }
    .deserialize(v);
    out.iter().map(ToString::to_string).collect()
}

/// One step of a [`FieldPath`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathSeg {
    Key(String),
    Index(usize),
}

/// Where a field is in a document; displays as `spec.ingress[0].source.selectr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPath(pub Vec<PathSeg>);

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                PathSeg::Key(k) if i == 0 => write!(f, "{k}")?,
                PathSeg::Key(k) => write!(f, ".{k}")?,
                PathSeg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// A path built on the stack and formatted only when a field is unknown.
enum Seg<'a> {
    Root,
    Key(&'a Seg<'a>, &'a str),
    Index(&'a Seg<'a>, usize),
}

impl Seg<'_> {
    fn to_path(&self) -> FieldPath {
        let mut segs = Vec::new();
        let mut at = self;
        loop {
            match at {
                Seg::Root => break,
                Seg::Key(p, k) => {
                    segs.push(PathSeg::Key((*k).to_string()));
                    at = p;
                }
                Seg::Index(p, i) => {
                    segs.push(PathSeg::Index(*i));
                    at = p;
                }
            }
        }
        segs.reverse();
        FieldPath(segs)
    }
}

struct Check<'a, 'p> {
    shape: &'static Shape,
    at: &'a Seg<'p>,
    out: &'a mut Vec<FieldPath>,
}

impl<'de> DeserializeSeed<'de> for Check<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        match self.shape {
            Shape::Any => d.deserialize_ignored_any(IgnoredAny).map(|_| ()),
            _ => d.deserialize_any(self),
        }
    }
}

impl<'de> Visitor<'de> for Check<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key_seed(KeyOf)? {
            check_entry(&mut map, self.shape, self.at, &key, self.out)?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let inner = match self.shape {
            Shape::List(inner) => *inner,
            _ => ANY,
        };
        let mut i = 0;
        loop {
            let at = Seg::Index(self.at, i);
            let next = seq.next_element_seed(Check {
                shape: inner,
                at: &at,
                out: self.out,
            })?;
            if next.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// Checks the value of the entry `key` of an object of shape `shape` at `at`.
fn check_entry<'de, A: MapAccess<'de>>(
    map: &mut A,
    shape: &'static Shape,
    at: &Seg<'_>,
    key: &str,
    out: &mut Vec<FieldPath>,
) -> Result<(), A::Error> {
    let field = match shape {
        Shape::Object(groups) => groups
            .iter()
            .flat_map(|g| g.iter())
            .find(|f| f.0 == key)
            .map(|f| f.1),
        Shape::Map(inner) => Some(*inner),
        // A list or scalar where an object stands: a type error for the typed decode.
        _ => Some(ANY),
    };
    let at = Seg::Key(at, key);
    match field {
        Some(shape) => map.next_value_seed(Check {
            shape,
            at: &at,
            out,
        }),
        None => {
            out.push(at.to_path());
            map.next_value::<IgnoredAny>().map(|_| ())
        }
    }
}

/// A Calico document's `apiVersion` and `kind` and its unknown fields, read in one pass.
pub(crate) struct HeadAndUnknown {
    pub api_version: Option<String>,
    pub kind: super::Kind,
    pub unknown: Vec<FieldPath>,
}

/// The decode's head read and [`unknown_field_paths`] in one pass over `json`, for documents
/// whose `kind` comes before every other field but `apiVersion` (as Calico and felixrs write
/// them). `None` when that pass cannot decide alone: the kind is missing, unknown or after another
/// field, `apiVersion` or `kind` is repeated, or the document is malformed; the caller then reads
/// the head and the unknown fields separately, which gives every error as before.
pub(crate) fn head_and_unknown_paths(json: &[u8]) -> Option<HeadAndUnknown> {
    let mut de = serde_json::Deserializer::from_slice(json);
    let mut out = Vec::new();
    let (api_version, kind) = de.deserialize_map(HeadCheck { out: &mut out }).ok()?;
    de.end().ok()?;
    Some(HeadAndUnknown {
        api_version,
        kind,
        unknown: out,
    })
}

struct HeadCheck<'a> {
    out: &'a mut Vec<FieldPath>,
}

impl<'de> Visitor<'de> for HeadCheck<'_> {
    type Value = (Option<String>, super::Kind);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a resource document")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        let undecided = || A::Error::custom("undecided");
        let mut api_version: Option<Option<String>> = None;
        let mut kind: Option<(super::Kind, &'static Shape)> = None;
        while let Some(key) = map.next_key_seed(KeyOf)? {
            match (&*key, kind) {
                ("apiVersion", _) if api_version.is_none() => {
                    api_version = Some(map.next_value()?);
                }
                ("kind", None) => {
                    let name: Option<String> = map.next_value()?;
                    let k = name
                        .as_deref()
                        .and_then(super::Kind::from_kind_name)
                        .ok_or_else(undecided)?;
                    kind = Some((k, calico_document(k)));
                }
                ("apiVersion" | "kind", _) | (_, None) => return Err(undecided()),
                (key, Some((_, shape))) => {
                    check_entry(&mut map, shape, &Seg::Root, key, self.out)?;
                }
            }
        }
        let (kind, _) = kind.ok_or_else(undecided)?;
        Ok((api_version.flatten(), kind))
    }
}

/// A map key, borrowed from the input when it has no escapes.
struct KeyOf;

enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl std::ops::Deref for Key<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        match self {
            Key::Borrowed(s) => s,
            Key::Owned(s) => s,
        }
    }
}

impl<'de> DeserializeSeed<'de> for KeyOf {
    type Value = Key<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key<'de>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyOf {
    type Value = Key<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
        Ok(Key::Borrowed(s))
    }
    fn visit_str<E>(self, s: &str) -> Result<Key<'de>, E> {
        Ok(Key::Owned(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Key<'de>, E> {
        Ok(Key::Owned(s))
    }
}

#[cfg(test)]
mod tests {
    use super::super::Kind;
    use super::*;
    use serde_json::json;

    fn unknown(kind: Kind, v: serde_json::Value) -> Vec<String> {
        let bytes = serde_json::to_vec(&v).unwrap();
        let from_bytes = unknown_fields(calico_document(kind), &bytes);
        assert_eq!(
            from_bytes,
            unknown_fields_in_value(calico_document(kind), &v)
        );
        from_bytes
    }

    #[test]
    fn paths_name_every_unknown_key() {
        let v = json!({
            "apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
            "metadata": {"name": "x", "labels": {"any": "thing"}, "nmae": "typo"},
            "spec": {
                "selectr": "all()",
                "ingress": [
                    {"action": "Allow"},
                    {"action": "Allow", "source": {"selectr": "a == 'b'", "nets": ["10.0.0.0/8"]},
                     "http": {"methods": ["GET"], "paths": [{"exact": "/", "regex": ".*"}]}}
                ],
                "egress": [{"action": "Deny", "destination": {"services": {"name": "a", "port": 1}}}]
            },
            "status": {"whatever": true}
        });
        // (serde_json::Value sorts keys: the order is the serialised document's.)
        assert_eq!(
            unknown(Kind::GlobalNetworkPolicy, v),
            vec![
                "metadata.nmae",
                "spec.egress[0].destination.services.port",
                "spec.ingress[1].http.paths[0].regex",
                "spec.ingress[1].source.selectr",
                "spec.selectr",
            ]
        );
    }

    #[test]
    fn every_known_field_of_a_full_policy_passes() {
        let rule = json!({
            "action": "Allow", "ipVersion": 4, "protocol": "TCP", "notProtocol": "UDP",
            "icmp": {"type": 8, "code": 0}, "notICMP": {"type": 3},
            "source": {"nets": [], "notNets": [], "selector": "a", "notSelector": "b",
                       "namespaceSelector": "c", "ports": [1], "notPorts": [2],
                       "serviceAccounts": {"names": ["x"], "selector": "y"},
                       "services": {"name": "s", "namespace": "n"}, "domains": ["example.com"]},
            "destination": {},
            "http": {"methods": ["GET"], "paths": [{"exact": "/a"}, {"prefix": "/b"}]},
            "metadata": {"annotations": {"k": "v"}}
        });
        let v = json!({
            "apiVersion": "projectcalico.org/v3", "kind": "StagedGlobalNetworkPolicy",
            "metadata": {"name": "x", "generateName": "x-", "uid": "u", "resourceVersion": "1",
                         "generation": 2, "creationTimestamp": "t", "ownerReferences": [],
                         "finalizers": [], "managedFields": [{"manager": "kubectl"}]},
            "spec": {"stagedAction": "Set", "tier": "default", "order": 1, "selector": "all()",
                     "types": ["Ingress"], "ingress": [rule.clone()], "egress": [rule],
                     "doNotTrack": false, "preDNAT": false, "applyOnForward": true,
                     "namespaceSelector": "", "serviceAccountSelector": "",
                     "performanceHints": ["AssumeNeededOnEveryNode"]}
        });
        assert!(unknown(Kind::StagedGlobalNetworkPolicy, v).is_empty());
        let k8s = json!({"kind": "StagedKubernetesNetworkPolicy", "metadata": {"name": "k"},
            "spec": {"stagedAction": "Set", "podSelector": {"matchLabels": {"a": "b"},
                     "matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]},
                     "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {}, "namespaceSelector": {},
                                            "ipBlock": {"cidr": "10.0.0.0/8", "except": []}}],
                                  "ports": [{"protocol": "TCP", "port": 80, "endPort": 90}]}],
                     "egress": [{"to": [{"podSelectr": {}}]}]}});
        assert_eq!(
            unknown(Kind::StagedKubernetesNetworkPolicy, k8s),
            vec!["spec.egress[0].to[0].podSelectr"]
        );
    }

    #[test]
    fn wrong_types_and_bad_json_are_left_to_the_typed_decode() {
        let v = json!({"kind": "Tier", "metadata": [1, 2], "spec": {"order": {"x": 1}}});
        assert!(unknown(Kind::Tier, v).is_empty());
        assert!(unknown_fields(calico_document(Kind::Tier), b"{not json").is_empty());
        let escaped = br#"{"spec": {"ord\u0065r": 1, "def\u0061ult": 2}}"#;
        assert_eq!(
            unknown_fields(calico_document(Kind::Tier), escaped),
            vec!["spec.default"]
        );
    }
}
