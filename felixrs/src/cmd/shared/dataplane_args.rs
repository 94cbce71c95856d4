//! The dataplane settings `felixrs agent` and `felixrs render` share, so that `render` prints what
//! the agent with the same flags would program.

use std::net::SocketAddr;

use iptables::render::host::{self, FailsafePort};
use iptables::render::{DenyLog, EndpointToHostAction, LogAction, RenderConfig, SourceSpoofing};

use crate::dns::config::{DEFAULT_QUEUE_NUM, parse_trusted_server};

/// Felix `WorkloadSourceSpoofing`: may pods send from the `allowedSourcePrefixes` they ask for?
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkloadSourceSpoofing {
    /// Every workload packet faces the strict reverse-path check; the annotation is ignored.
    Disabled,
    /// A pod may send from the prefixes of its `cni.projectcalico.org/allowedSourcePrefixes`.
    Any,
}

/// Felix `DefaultEndpointToHostAction`: what happens to workload traffic to the host itself once
/// the workload's egress policy allowed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EndpointToHost {
    /// Accept it (calico.yaml's setting; kubelet probes and host services keep working).
    Accept,
    /// Drop it.
    Drop,
    /// Return to the host's own INPUT rules.
    Return,
}

/// Dataplane flags of `agent`, `render` and `trace`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct DataplaneArgs {
    /// Mark bits the agent may use (hex).
    #[arg(long, env = "FELIXRS_MARK_MASK", default_value = "0xffff0000", value_parser = parse_hex_u32)]
    pub mark_mask: u32,
    /// Workload interface name prefixes, comma separated (Felix `InterfacePrefix`). The first one
    /// must be the policy controller's `--interface-prefix`; interfaces with any of them are
    /// policed, and an unknown one is dropped.
    #[arg(
        long,
        env = "FELIXRS_INTERFACE_PREFIX",
        value_delimiter = ',',
        default_value = "cali"
    )]
    pub interface_prefix: Vec<String>,
    /// What happens to workload traffic to this host once egress policy allowed it (Felix
    /// `DefaultEndpointToHostAction`).
    #[arg(
        long,
        env = "FELIXRS_DEFAULT_ENDPOINT_TO_HOST_ACTION",
        value_enum,
        ignore_case = true,
        default_value = "accept"
    )]
    pub default_endpoint_to_host_action: EndpointToHost,
    /// Whether pods may send from their `allowedSourcePrefixes` (Felix `WorkloadSourceSpoofing`).
    #[arg(
        long,
        env = "FELIXRS_WORKLOAD_SOURCE_SPOOFING",
        value_enum,
        ignore_case = true,
        default_value = "disabled"
    )]
    pub workload_source_spoofing: WorkloadSourceSpoofing,
    /// Log denied packets: a kernel-rate-limited NFLOG rule before every policy Deny, tier-end and
    /// "no profile matched" DROP (groups 1 ingress, 2 egress; read them with `felixrs flows`).
    #[arg(long, env = "FELIXRS_LOG_DENIED")]
    pub log_denied: bool,
    /// Flow logs: Felix's flow-log NFLOG rules on every verdict (groups 1 ingress, 2 egress,
    /// unlimited, headers only; supersede `--log-denied`); the agent collects them (`/flows`,
    /// `--flow-logs-file`). Off by default.
    #[arg(long, env = "FELIXRS_FLOW_LOGS")]
    pub flow_logs: bool,
    /// Where Calico's Log action sends packets: `log` (the kernel log, Felix's default) or `nflog`
    /// (NFLOG group 3 with a prefix naming the policy; `felixrs flows` reads it).
    #[arg(
        long,
        env = "FELIXRS_LOG_ACTION",
        value_enum,
        ignore_case = true,
        default_value = "log"
    )]
    pub log_action: LogTo,
    /// Whether endpoints with the same tiers, policies and profiles share one policy chain
    /// (`cali-si-`/`cali-so-`) instead of each repeating the jumps (Felix's layout: `false`).
    #[arg(
        long,
        env = "FELIXRS_SHARE_CHAINS",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub share_chains: bool,
    /// DNS servers whose responses to local pods teach the agent the addresses of the names in
    /// `destination.domains` rules (`IP[:PORT]`, `[IPv6]:PORT`, comma separated; port 53 when
    /// absent). Their responses are held until the addresses are allowed. No default: without
    /// it nothing is learned and domain rules match nothing.
    #[arg(
        long,
        env = "FELIXRS_DNS_TRUSTED_SERVERS",
        value_delimiter = ',',
        value_parser = parse_trusted_server
    )]
    pub dns_trusted_servers: Vec<SocketAddr>,
    /// The NFQUEUE number DNS responses are held on.
    #[arg(long, env = "FELIXRS_DNS_QUEUE_NUM", default_value_t = DEFAULT_QUEUE_NUM)]
    pub dns_queue_num: u16,
    /// Traffic into this host that host endpoint policy never blocks (Felix
    /// `FailsafeInboundHostPorts`): `proto:port` or `proto:net:port` (IPv6 nets in brackets),
    /// comma separated; empty or `none` turns them off.
    #[arg(
        long,
        env = "FELIXRS_FAILSAFE_INBOUND_HOST_PORTS",
        default_value = host::DEFAULT_INBOUND,
        value_parser = parse_failsafe
    )]
    pub failsafe_inbound_host_ports: FailsafePorts,
    /// Traffic out of this host that host endpoint policy never blocks (Felix
    /// `FailsafeOutboundHostPorts`), in the same syntax.
    #[arg(
        long,
        env = "FELIXRS_FAILSAFE_OUTBOUND_HOST_PORTS",
        default_value = host::DEFAULT_OUTBOUND,
        value_parser = parse_failsafe
    )]
    pub failsafe_outbound_host_ports: FailsafePorts,
}

/// A failsafe port list flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailsafePorts(pub Vec<FailsafePort>);

fn parse_failsafe(s: &str) -> Result<FailsafePorts, host::FailsafePortError> {
    host::parse_failsafe_ports(s).map(FailsafePorts)
}

/// Where the Log action's packets go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogTo {
    Log,
    Nflog,
}

/// The NFLOG group of the Log action with `--log-action nflog`.
pub const LOG_ACTION_NFLOG_GROUP: u16 = 3;

impl Default for DataplaneArgs {
    /// The flags' defaults.
    fn default() -> Self {
        DataplaneArgs {
            mark_mask: 0xffff_0000,
            interface_prefix: vec!["cali".into()],
            default_endpoint_to_host_action: EndpointToHost::Accept,
            workload_source_spoofing: WorkloadSourceSpoofing::Disabled,
            log_denied: false,
            flow_logs: false,
            log_action: LogTo::Log,
            share_chains: true,
            dns_trusted_servers: Vec::new(),
            dns_queue_num: DEFAULT_QUEUE_NUM,
            failsafe_inbound_host_ports: FailsafePorts(host::default_inbound()),
            failsafe_outbound_host_ports: FailsafePorts(host::default_outbound()),
        }
    }
}

impl DataplaneArgs {
    /// The renderer configuration these flags describe (the renderer validates it).
    pub fn render_config(&self) -> RenderConfig {
        RenderConfig {
            mark_mask: self.mark_mask,
            interface_prefixes: self.interface_prefix.clone(),
            default_endpoint_to_host_action: match self.default_endpoint_to_host_action {
                EndpointToHost::Accept => EndpointToHostAction::Accept,
                EndpointToHost::Drop => EndpointToHostAction::Drop,
                EndpointToHost::Return => EndpointToHostAction::Return,
            },
            workload_source_spoofing: match self.workload_source_spoofing {
                WorkloadSourceSpoofing::Disabled => SourceSpoofing::Disabled,
                WorkloadSourceSpoofing::Any => SourceSpoofing::Any,
            },
            deny_log: self.log_denied.then(DenyLog::default),
            flow_logs: self.flow_logs,
            log_action: match self.log_action {
                LogTo::Log => LogAction::Log,
                LogTo::Nflog => LogAction::Nflog {
                    group: LOG_ACTION_NFLOG_GROUP,
                },
            },
            share_chains: self.share_chains,
            dns_trusted_servers: self.dns_trusted_servers.clone(),
            dns_queue_num: self.dns_queue_num,
            failsafe_inbound: self.failsafe_inbound_host_ports.0.clone(),
            failsafe_outbound: self.failsafe_outbound_host_ports.0.clone(),
            ..RenderConfig::default()
        }
    }

    /// The prefix the controller names veths with: the first one.
    pub fn veth_prefix(&self) -> &str {
        self.interface_prefix.first().map_or("cali", String::as_str)
    }
}

/// A `--mark-mask` that is not a hex number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid hex mark mask {text:?}: {error}")]
pub struct HexMaskError {
    pub text: String,
    pub error: std::num::ParseIntError,
}

/// Parses a hex mark mask, with or without `0x`.
pub fn parse_hex_u32(s: &str) -> Result<u32, HexMaskError> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    u32::from_str_radix(digits, 16).map_err(|error| HexMaskError {
        text: s.to_string(),
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        dp: DataplaneArgs,
    }

    #[test]
    fn defaults_are_the_renderers_and_flags_map_onto_it() {
        let d = Cli::parse_from(["x"]).dp;
        assert_eq!(d, DataplaneArgs::default());
        assert_eq!(d.render_config(), RenderConfig::default());
        let c = Cli::parse_from([
            "x",
            "--mark-mask",
            "0XFF00",
            "--interface-prefix",
            "tap,cali",
            "--default-endpoint-to-host-action",
            "Drop",
            "--workload-source-spoofing",
            "any",
            "--dns-trusted-servers",
            "10.96.0.10,[fd00::10]:5353",
            "--dns-queue-num",
            "7",
        ]);
        assert_eq!(c.dp.veth_prefix(), "tap");
        let cfg = c.dp.render_config();
        assert_eq!(cfg.mark_mask, 0xff00);
        assert_eq!(cfg.interface_prefixes, ["tap", "cali"]);
        assert_eq!(
            cfg.default_endpoint_to_host_action,
            EndpointToHostAction::Drop
        );
        assert_eq!(cfg.workload_source_spoofing, SourceSpoofing::Any);
        assert_eq!(
            cfg.dns_trusted_servers,
            [
                "10.96.0.10:53".parse().unwrap(),
                "[fd00::10]:5353".parse().unwrap()
            ]
        );
        assert_eq!(cfg.dns_queue_num, 7);
        let e = Cli::try_parse_from(["x", "--dns-trusted-servers", "dns.local"])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("dns.local"), "{e}");
        assert!(Cli::try_parse_from(["x", "--mark-mask", "zz"]).is_err());
    }

    #[test]
    fn failsafe_ports_parse_felix_syntax_empty_turns_them_off_and_bad_ones_are_named() {
        let c = Cli::parse_from([
            "x",
            "--failsafe-inbound-host-ports",
            "tcp:22,tcp:10.0.0.0/8:6443",
            "--failsafe-outbound-host-ports",
            "",
        ]);
        let cfg = c.dp.render_config();
        assert_eq!(cfg.failsafe_inbound.len(), 2);
        assert_eq!(cfg.failsafe_inbound[1].to_string(), "tcp:10.0.0.0/8:6443");
        assert!(cfg.failsafe_outbound.is_empty());
        let e = Cli::try_parse_from(["x", "--failsafe-inbound-host-ports", "tcp:22,ssh"])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("invalid failsafe port \"ssh\""), "{e}");
    }
}
