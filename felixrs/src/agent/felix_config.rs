//! The agent's settings from Calico's FelixConfiguration resources, with Felix's precedence.
//!
//! Each setting the agent implements is one entry of [`FIELDS`]: its Calico field name (and so
//! its environment variable, `FELIX_<FIELDNAME>` upper-case), the `felixrs agent` flag it sets,
//! how a value is read (Felix's syntax: `90s`, `Drop`, `0xffff0000`, ...), and whether a change
//! applies live or needs a restart. A setting's value comes from, highest first:
//!
//! 1. the flag given on the command line or by its `FELIXRS_*` variable (clap's `value_source`; a
//!    flag left at its default overrides nothing),
//! 2. Felix's `FELIX_<FIELDNAME>` environment variable,
//! 3. FelixConfiguration `node.<nodename>`,
//! 4. FelixConfiguration `default`,
//! 5. the flag's built-in default.
//!
//! A spec field not in the table is reported once by name (log and `/status`
//! `felix_configuration.unsupported_fields`), never silently dropped. An invalid value is an error
//! naming the resource (or variable) and field, and the setting keeps its last good value.
//!
//! Live vs restart: `logSeverityScreen` (the log filter is reloaded) and `iptablesRefreshInterval`
//! (the apply thread reads its period afresh) apply live. Every other field changes what the
//! renderer, the appliers or the HTTP listener were built with, so a change makes the agent re-exec itself (same argv and
//! environment) after the snapshot is written: the new process reads the settings before it
//! builds anything and programs from etcd's list or that snapshot, the kernel untouched meanwhile
//! (with the DNS learner's queue open, it exits for its supervisor instead: see `Args::run`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use calc_graph::model::{
    FelixConfiguration, GLOBAL_FELIX_CONFIGURATION, felix_configuration_key,
    node_felix_configuration, parse_duration,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::apply_loop::RefreshPeriod;
use super::{Args, IptablesBackend};
use crate::cmd::shared::dataplane_args::{EndpointToHost, FailsafePorts, WorkloadSourceSpoofing};
use crate::dns::config::parse_trusted_server;
use iptables::render::host::parse_failsafe_ports;

/// Felix's `IptablesRefreshInterval: 0` (no periodic refresh): the agent's refresh this far apart.
pub const REFRESH_DISABLED: Duration = Duration::from_secs(365 * 24 * 3600);

/// One setting the agent reads from FelixConfiguration.
pub struct Field {
    /// Calico's spec field (`defaultEndpointToHostAction`).
    pub calico: &'static str,
    /// The clap id of the `felixrs agent` flag it sets (`default_endpoint_to_host_action`).
    pub flag: &'static str,
    /// A change applies without a restart.
    pub live: bool,
    set: fn(&mut Args, &Value) -> Result<(), ValueError>,
    copy: fn(&mut Args, &Args),
    show: fn(&Args) -> String,
}

impl Field {
    /// Felix's environment variable for it (`FELIX_DEFAULTENDPOINTTOHOSTACTION`).
    pub fn env(&self) -> String {
        format!("FELIX_{}", self.calico.to_uppercase())
    }
}

macro_rules! field {
    ($calico:literal, $flag:literal, live: $live:expr, $($path:ident).+, $parse:expr) => {
        field!($calico, $flag, live: $live, $($path).+, $parse, |v| show(v))
    };
    ($calico:literal, $flag:literal, live: $live:expr, $($path:ident).+, $parse:expr, $show:expr) => {
        Field {
            calico: $calico,
            flag: $flag,
            live: $live,
            set: |a, v| {
                a.$($path).+ = ($parse)(v)?;
                Ok(())
            },
            copy: |a, b| a.$($path).+ = b.$($path).+.clone(),
            show: |a| ($show)(&a.$($path).+),
        }
    };
}

/// Felix's fields the agent implements, one entry each. Agent flags with no Felix
/// field: `--drift-interval` (Felix has no fast drift check), `--counters-interval`,
/// `--dns-min-ttl`, `--dns-max-learned`, `--log-denied`, `--log-action`, `--share-chains`, the
/// etcd and state flags.
pub static FIELDS: &[Field] = &[
    field!("interfacePrefix", "interface_prefix", live: false, dataplane.interface_prefix, interface_prefixes),
    field!("iptablesMarkMask", "mark_mask", live: false, dataplane.mark_mask, mark_mask),
    field!("defaultEndpointToHostAction", "default_endpoint_to_host_action", live: false,
        dataplane.default_endpoint_to_host_action, endpoint_to_host),
    field!("workloadSourceSpoofing", "workload_source_spoofing", live: false,
        dataplane.workload_source_spoofing, source_spoofing),
    field!("iptablesBackend", "iptables_backend", live: false, iptables_backend, backend),
    field!("iptablesRefreshInterval", "refresh_interval", live: true, refresh_interval, refresh),
    field!("logSeverityScreen", "log", live: true, log, severity),
    field!("dnsTrustedServers", "dns_trusted_servers", live: false, dataplane.dns_trusted_servers,
        trusted_servers),
    field!("dnsPolicyNfqueueID", "dns_queue_num", live: false, dataplane.dns_queue_num, queue_id),
    field!("healthPort", "health_listen", live: false, health_listen, health_port),
    field!("failsafeInboundHostPorts", "failsafe_inbound_host_ports", live: false,
        dataplane.failsafe_inbound_host_ports, failsafe_ports, show_ports),
    field!("failsafeOutboundHostPorts", "failsafe_outbound_host_ports", live: false,
        dataplane.failsafe_outbound_host_ports, failsafe_ports, show_ports),
];

/// `dnsPolicyMode`: the agent holds DNS responses until their addresses are allowed, Felix's
/// `DelayDNSResponse`; it has no flag, so another mode is an error, not a setting.
const DNS_POLICY_MODE: &str = "dnsPolicyMode";

/// A value as `/status` shows it: its Debug form, a string without its quotes.
fn show(v: &dyn std::fmt::Debug) -> String {
    let d = format!("{v:?}");
    match d.strip_prefix('"').and_then(|d| d.strip_suffix('"')) {
        Some(inner) => inner.to_string(),
        None => d,
    }
}

/// Why a FelixConfiguration value was refused (the caller names the resource and field).
#[derive(Debug, thiserror::Error)]
pub enum ValueError {
    #[error("expected a string, got {0}")]
    NotText(Value),
    #[error("{value:?} is not one of {choices}")]
    NotOneOf { value: String, choices: String },
    #[error("invalid interface prefix {0:?}: must be 1-14 characters of [A-Za-z0-9._-]")]
    InterfacePrefix(String),
    #[error("{0} is not a 32-bit mask")]
    MaskNumber(serde_json::Number),
    #[error("{text:?} is not a 32-bit mask: {error}")]
    MaskText {
        text: String,
        error: std::num::ParseIntError,
    },
    #[error("mask {0:#x} has fewer than 5 bits (need accept, pass, drop, scratch0, scratch1)")]
    MaskBits(u32),
    #[error(transparent)]
    Duration(#[from] calc_graph::model::DurationError),
    #[error(
        "{0:?}: k8s-service entries are not supported (the agent has no Kubernetes client); give \
         the service's address"
    )]
    K8sService(String),
    #[error(transparent)]
    TrustedServer(#[from] crate::dns::config::TrustedServerError),
    #[error("{0} is not an NFQUEUE number (0-65535)")]
    QueueId(Value),
    #[error("{0} is not a port")]
    Port(Value),
    #[error("port 0")]
    PortZero,
    #[error("[{0}].port: missing or not a number")]
    FailsafePort(usize),
    #[error(transparent)]
    Failsafe(#[from] iptables::render::host::FailsafePortError),
    #[error("{0:?}: the agent implements only DelayDNSResponse (it holds DNS responses)")]
    DnsPolicyMode(String),
}

fn text(v: &Value) -> Result<&str, ValueError> {
    v.as_str().ok_or_else(|| ValueError::NotText(v.clone()))
}

fn one_of<T: Copy>(v: &Value, choices: &[(&str, T)]) -> Result<T, ValueError> {
    let s = text(v)?;
    choices
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(s))
        .map(|(_, t)| *t)
        .ok_or_else(|| {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            ValueError::NotOneOf {
                value: s.to_string(),
                choices: names.join(", "),
            }
        })
}

fn interface_prefixes(v: &Value) -> Result<Vec<String>, ValueError> {
    let out: Vec<String> = text(v)?.split(',').map(|p| p.trim().to_string()).collect();
    for p in &out {
        let ok = (1..=14).contains(&p.len())
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !ok {
            return Err(ValueError::InterfacePrefix(p.clone()));
        }
    }
    Ok(out)
}

fn mark_mask(v: &Value) -> Result<u32, ValueError> {
    let mask = match v {
        Value::Number(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| ValueError::MaskNumber(n.clone()))?,
        _ => {
            let s = text(v)?.trim();
            match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
                Some(hex) => u32::from_str_radix(hex, 16),
                None => s.parse(),
            }
            .map_err(|error| ValueError::MaskText {
                text: s.to_string(),
                error,
            })?
        }
    };
    if mask.count_ones() < 5 {
        return Err(ValueError::MaskBits(mask));
    }
    Ok(mask)
}

fn endpoint_to_host(v: &Value) -> Result<EndpointToHost, ValueError> {
    one_of(
        v,
        &[
            ("Drop", EndpointToHost::Drop),
            ("Accept", EndpointToHost::Accept),
            ("Return", EndpointToHost::Return),
        ],
    )
}

fn source_spoofing(v: &Value) -> Result<WorkloadSourceSpoofing, ValueError> {
    one_of(
        v,
        &[
            ("Disabled", WorkloadSourceSpoofing::Disabled),
            ("Any", WorkloadSourceSpoofing::Any),
        ],
    )
}

fn backend(v: &Value) -> Result<IptablesBackend, ValueError> {
    one_of(
        v,
        &[
            ("Auto", IptablesBackend::Auto),
            ("Legacy", IptablesBackend::Legacy),
            ("NFT", IptablesBackend::Nft),
        ],
    )
}

fn refresh(v: &Value) -> Result<Duration, ValueError> {
    let d = parse_duration(text(v)?)?;
    Ok(if d.is_zero() { REFRESH_DISABLED } else { d })
}

fn severity(v: &Value) -> Result<String, ValueError> {
    one_of(
        v,
        &[
            ("Debug", "debug"),
            ("Info", "info"),
            ("Warning", "warn"),
            ("Error", "error"),
            ("Fatal", "error"),
            ("Panic", "error"),
        ],
    )
    .map(String::from)
}

fn trusted_servers(v: &Value) -> Result<Vec<SocketAddr>, ValueError> {
    let items: Vec<&str> = match v {
        Value::Array(a) => a.iter().map(text).collect::<Result<_, _>>()?,
        _ => text(v)?.split(',').collect(),
    };
    items
        .into_iter()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            if s.starts_with("k8s-service:") {
                return Err(ValueError::K8sService(s.to_string()));
            }
            Ok(parse_trusted_server(s)?)
        })
        .collect()
}

fn queue_id(v: &Value) -> Result<u16, ValueError> {
    let n = match v {
        Value::Number(n) => n.as_u64(),
        _ => text(v)?.trim().parse().ok(),
    };
    n.and_then(|n| u16::try_from(n).ok())
        .ok_or_else(|| ValueError::QueueId(v.clone()))
}

/// `healthPort` sets the port of `--health-listen` (Felix's `healthHost` is not read: the agent
/// keeps its own address).
fn health_port(v: &Value) -> Result<SocketAddr, ValueError> {
    let port = queue_id(v).map_err(|_| ValueError::Port(v.clone()))?;
    if port == 0 {
        return Err(ValueError::PortZero);
    }
    // The address is filled in by `resolve` from the flag's.
    Ok(SocketAddr::new(IpAddr::from([0, 0, 0, 0]), port))
}

/// Felix's failsafe list: the v3 resource's `[{"protocol": "TCP", "port": 22, "net": "…"}]`, or
/// the variable's `tcp:22,udp:68` (`none` or empty: no ports).
fn failsafe_ports(v: &Value) -> Result<FailsafePorts, ValueError> {
    let text = match v {
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let field = |k: &str| p.get(k).filter(|v| !v.is_null());
                let proto = field("protocol")
                    .and_then(Value::as_str)
                    .unwrap_or("TCP")
                    .to_ascii_lowercase();
                let port = field("port")
                    .and_then(Value::as_u64)
                    .ok_or(ValueError::FailsafePort(i))?;
                Ok(match field("net").and_then(Value::as_str) {
                    Some(net) if net.contains(':') => format!("{proto}:[{net}]:{port}"),
                    Some(net) => format!("{proto}:{net}:{port}"),
                    None => format!("{proto}:{port}"),
                })
            })
            .collect::<Result<Vec<_>, ValueError>>()?
            .join(","),
        _ => text(v)?.to_string(),
    };
    Ok(FailsafePorts(parse_failsafe_ports(&text)?))
}

/// A failsafe list in Felix's variable syntax (`tcp:22,udp:68`; `none`).
fn show_ports(p: &FailsafePorts) -> String {
    if p.0.is_empty() {
        return "none".into();
    }
    p.0.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn dns_policy_mode(v: &Value) -> Result<(), ValueError> {
    match text(v)? {
        "DelayDNSResponse" => Ok(()),
        other => Err(ValueError::DnsPolicyMode(other.to_string())),
    }
}

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// The flag, given on the command line or by its `FELIXRS_*` variable.
    Flag,
    /// Felix's `FELIX_*` variable.
    Environment,
    /// FelixConfiguration `node.<nodename>`.
    Node,
    /// FelixConfiguration `default`.
    Global,
    /// The flag's default.
    Default,
}

/// `/status` `felix_configuration`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FelixConfigStatus {
    /// The FelixConfiguration resources read (`default`, `node.<nodename>`).
    pub resources: Vec<String>,
    /// Each implemented Calico field: where its value comes from.
    pub sources: BTreeMap<String, Origin>,
    /// Each implemented Calico field: its effective value.
    pub values: BTreeMap<String, String>,
    /// Spec fields the agent does not implement (`resource.field`'s field, sorted).
    pub unsupported_fields: Vec<String>,
    /// Invalid values (`felixconfigurations/<name>: <field>: <problem>`); each setting keeps its
    /// last good value.
    pub errors: Vec<String>,
    /// Restart-needing fields whose datastore value differs from what this process runs with
    /// (the agent is re-exec'ing itself).
    pub restart_pending: Vec<String>,
}

/// The settings one resolution arrived at.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub args: Args,
    pub status: FelixConfigStatus,
}

/// The inputs that do not change while the agent runs: the flags as parsed, which of them were
/// given, Felix's variables and the node's name.
#[derive(Debug, Clone)]
pub struct Layers {
    pub flags: Args,
    pub explicit: BTreeSet<String>,
    pub env: BTreeMap<String, String>,
    pub node: String,
}

impl Layers {
    /// With the `FELIX_*` variables of this process.
    pub fn from_process(flags: Args, explicit: BTreeSet<String>) -> Self {
        let env = std::env::vars()
            .filter(|(k, _)| k.starts_with("FELIX_"))
            .collect();
        let node = flags.node_name.clone();
        Layers {
            flags,
            explicit,
            env,
            node,
        }
    }

    /// The settings from these layers and the `default`/`node.<name>` resources; an invalid
    /// value keeps `previous`'s.
    pub fn resolve(
        &self,
        global: Option<&FelixConfiguration>,
        node: Option<&FelixConfiguration>,
        previous: &Args,
    ) -> Resolved {
        let mut args = self.flags.clone();
        let mut status = FelixConfigStatus {
            resources: [global, node]
                .into_iter()
                .flatten()
                .map(|c| c.name.clone())
                .collect(),
            ..Default::default()
        };
        let resources = [(node, Origin::Node), (global, Origin::Global)];
        for f in FIELDS {
            let origin = if self.explicit.contains(f.flag) {
                Origin::Flag
            } else if let Some(v) = self.env.get(&f.env()) {
                let value = Value::String(v.clone());
                match (f.set)(&mut args, &value) {
                    Ok(()) => Origin::Environment,
                    Err(e) => {
                        status.errors.push(format!("environment {}: {e}", f.env()));
                        (f.copy)(&mut args, previous);
                        Origin::Environment
                    }
                }
            } else if let Some((c, origin, v)) = resources
                .iter()
                .find_map(|(c, o)| c.and_then(|c| Some((c, o.clone(), c.spec.get(f.calico)?))))
            {
                if let Err(e) = (f.set)(&mut args, v) {
                    status
                        .errors
                        .push(format!("felixconfigurations/{}: {}: {e}", c.name, f.calico));
                    (f.copy)(&mut args, previous);
                }
                origin
            } else {
                Origin::Default
            };
            status.sources.insert(f.calico.to_string(), origin);
        }
        // `healthPort` sets only the port.
        if args.health_listen.port() != self.flags.health_listen.port()
            && !self.explicit.contains("health_listen")
        {
            args.health_listen.set_ip(self.flags.health_listen.ip());
        }
        let mut unsupported = BTreeSet::new();
        for c in [global, node].into_iter().flatten() {
            for (k, v) in &c.spec {
                if k == DNS_POLICY_MODE {
                    if let Err(e) = dns_policy_mode(v) {
                        status
                            .errors
                            .push(format!("felixconfigurations/{}: {k}: {e}", c.name));
                    }
                } else if !FIELDS.iter().any(|f| f.calico == k) {
                    unsupported.insert(k.clone());
                }
            }
        }
        status.unsupported_fields = unsupported.into_iter().collect();
        status.values = FIELDS
            .iter()
            .map(|f| (f.calico.to_string(), (f.show)(&args)))
            .collect();
        Resolved { args, status }
    }
}

/// The restart-needing fields whose values differ between `running` and `wanted`.
pub fn restart_needed(running: &Args, wanted: &Args) -> Vec<String> {
    FIELDS
        .iter()
        .filter(|f| !f.live && (f.show)(running) != (f.show)(wanted))
        .map(|f| f.calico.to_string())
        .collect()
}

/// The canonical keys of `node`'s two resources: (`default`, `node.<node>`).
pub fn keys(node: &str) -> (String, String) {
    (
        felix_configuration_key(GLOBAL_FELIX_CONFIGURATION),
        felix_configuration_key(&node_felix_configuration(node)),
    )
}

/// The `default` and `node.<node>` resources among `get`'s values: absent (`Ok(None)`), decoded,
/// or why not (the caller keeps its last good one).
pub fn decode(
    node: &str,
    get: impl Fn(&str) -> Option<Vec<u8>>,
) -> [Result<Option<FelixConfiguration>, String>; 2] {
    let (g, n) = keys(node);
    let one = |k: &str| match get(k) {
        None => Ok(None),
        Some(v) => FelixConfiguration::from_etcd(k, &v)
            .map(Some)
            .map_err(|e| e.to_string()),
    };
    [one(&g), one(&n)]
}

/// Applies a new log filter live.
pub type ReloadLog = Box<dyn Fn(&str) -> Result<(), ReloadLogError> + Send>;

/// Why a new log filter was not applied (shown after `logSeverityScreen: `).
#[derive(Debug, thiserror::Error)]
pub enum ReloadLogError {
    /// The filter does not parse.
    #[error(transparent)]
    Filter(#[from] tracing_subscriber::filter::ParseError),
    /// The subscriber is gone.
    #[error(transparent)]
    Reload(#[from] tracing_subscriber::reload::Error),
}

/// The running agent's view of its settings: re-resolved whenever a FelixConfiguration of this
/// node changes; live fields applied at once, restart-needing ones recorded in [`Self::restart`]
/// for the agent to re-exec itself once the runtime has stopped.
pub struct ConfigWatch {
    layers: Layers,
    running: Args,
    /// `default`, `node.<node>`: the last versions that decoded.
    last_good: [Option<FelixConfiguration>; 2],
    reported: BTreeSet<String>,
    reload_log: ReloadLog,
    /// The apply thread's refresh period, once it runs.
    refresh: Option<RefreshPeriod>,
    /// The restart-needing fields that changed (the runtime stops; the agent re-execs).
    pub restart: Option<Vec<String>>,
}

impl std::fmt::Debug for ConfigWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigWatch")
            .field("node", &self.layers.node)
            .field("restart", &self.restart)
            .finish_non_exhaustive()
    }
}

impl ConfigWatch {
    pub fn new(layers: Layers, reload_log: ReloadLog) -> Self {
        ConfigWatch {
            running: layers.flags.clone(),
            layers,
            last_good: [None, None],
            reported: BTreeSet::new(),
            reload_log,
            refresh: None,
            restart: None,
        }
    }

    /// Where `iptablesRefreshInterval` applies live.
    pub fn live_refresh(&mut self, period: RefreshPeriod) {
        self.refresh = Some(period);
    }

    /// The settings to start with, from `get`'s resources (read before anything is built).
    pub fn start(
        &mut self,
        get: impl Fn(&str) -> Option<Vec<u8>>,
        hub: &super::status::StatusHub,
    ) -> Args {
        let r = self.resolve(get);
        self.running = r.args.clone();
        let _ = (self.reload_log)(&self.running.log);
        hub.update(|s| s.felix_configuration = Some(r.status));
        self.running.clone()
    }

    /// Re-reads this node's resources from `get`: applies live changes; true when a
    /// restart-needing field changed (then [`Self::restart`] names them).
    pub fn update(
        &mut self,
        get: impl Fn(&str) -> Option<Vec<u8>>,
        hub: &super::status::StatusHub,
    ) -> bool {
        let mut r = self.resolve(get);
        if r.args.log != self.running.log {
            match (self.reload_log)(&r.args.log) {
                Ok(()) => {
                    tracing::info!(filter = %r.args.log, "log level changed (FelixConfiguration logSeverityScreen)");
                    self.running.log = r.args.log.clone();
                }
                Err(e) => r.status.errors.push(format!("logSeverityScreen: {e}")),
            }
        }
        if r.args.refresh_interval != self.running.refresh_interval
            && let Some(p) = &self.refresh
        {
            p.set(r.args.refresh_interval);
            tracing::info!(period = ?r.args.refresh_interval, "full refresh period changed (FelixConfiguration iptablesRefreshInterval)");
            self.running.refresh_interval = r.args.refresh_interval;
        }
        let restart = restart_needed(&self.running, &r.args);
        let needed = !restart.is_empty();
        if needed {
            tracing::warn!(fields = %restart.join(", "), "FelixConfiguration changed settings that need a restart; restarting the agent (re-exec)");
            r.status.restart_pending = restart.clone();
            self.restart = Some(restart);
        }
        hub.update(|s| s.felix_configuration = Some(r.status));
        needed
    }

    fn resolve(&mut self, get: impl Fn(&str) -> Option<Vec<u8>>) -> Resolved {
        let mut errors = Vec::new();
        for (slot, res) in self
            .last_good
            .iter_mut()
            .zip(decode(&self.layers.node, get))
        {
            match res {
                Ok(c) => *slot = c,
                Err(e) => errors.push(e),
            }
        }
        let [g, n] = &self.last_good;
        let mut r = self.layers.resolve(g.as_ref(), n.as_ref(), &self.running);
        r.status.errors.splice(0..0, errors);
        for field in &r.status.unsupported_fields {
            if self.reported.insert(field.clone()) {
                tracing::warn!(%field, "FelixConfiguration field not implemented by felixrs; ignored");
            }
        }
        for error in &r.status.errors {
            tracing::error!(%error, "invalid FelixConfiguration value; the setting keeps its last good value");
        }
        r
    }
}

#[cfg(test)]
#[path = "felix_config_tests.rs"]
mod tests;
