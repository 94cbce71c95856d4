//! IPPool validation: libcalico-go's `validateIPPoolSpec` and the CRD's CEL rules
//! (`api/pkg/apis/projectcalico/v3/ippool.go`).

use ipnet::IpNet;

use super::Ctx;
use crate::model::ippool::{AllowedUse, EncapMode, IpPoolSpec};

fn encap_on(m: Option<EncapMode>) -> bool {
    matches!(m, Some(EncapMode::Always | EncapMode::CrossSubnet))
}

pub(super) fn ip_pool(ctx: &mut Ctx<'_>, s: &IpPoolSpec) {
    let cidr = if s.cidr.is_empty() {
        ctx.err("spec.cidr", "cidr is required");
        None
    } else {
        match s.cidr.parse::<IpNet>() {
            Ok(net) => Some(net),
            Err(_) => {
                ctx.err("spec.cidr", format!("invalid CIDR {:?}", s.cidr));
                None
            }
        }
    };
    if let Some(net) = cidr {
        if net.trunc() != net {
            ctx.err(
                "spec.cidr",
                format!(
                    "IPPool CIDR must be strictly masked: {} has host bits set (the network is {})",
                    s.cidr,
                    net.trunc()
                ),
            );
        }
        let link_local: IpNet = if net.addr().is_ipv4() {
            "169.254.0.0/16".parse().expect("literal")
        } else {
            "fe80::/10".parse().expect("literal")
        };
        if link_local.contains(&net.addr()) || net.contains(&link_local.addr()) {
            ctx.err(
                "spec.cidr",
                format!("IPPool CIDR {net} overlaps with the link-local range {link_local}"),
            );
        }
        let v4 = net.addr().is_ipv4();
        let (lo, hi, default) = if v4 { (20, 32, 26) } else { (116, 128, 122) };
        if s.block_size != 0 && !(lo..=hi).contains(&s.block_size) {
            ctx.err(
                "spec.blockSize",
                format!(
                    "blockSize must be between {lo} and {hi} for an IPv{} pool, got {}",
                    if v4 { 4 } else { 6 },
                    s.block_size
                ),
            );
        }
        let block = if s.block_size == 0 {
            default
        } else {
            s.block_size
        };
        if !s.disabled && net.prefix_len() > block {
            ctx.err(
                "spec.cidr",
                format!(
                    "IP pool size is too small for use with Calico IPAM: /{} is smaller than the block size /{block}",
                    net.prefix_len()
                ),
            );
        }
        if !v4 && encap_on(s.ipip_mode) {
            ctx.err("spec.ipipMode", "IPIP is not supported on IPv6 pools");
        }
    }
    if encap_on(s.ipip_mode) && encap_on(s.vxlan_mode) {
        ctx.err(
            "spec.vxlanMode",
            "ipipMode and vxlanMode cannot both be enabled",
        );
    }
    for (i, u) in s.allowed_uses.iter().enumerate() {
        if s.allowed_uses[..i].contains(u) {
            ctx.err(
                format!("spec.allowedUses[{i}]"),
                format!("{u:?} is listed more than once"),
            );
        }
    }
    if s.allowed_uses.contains(&AllowedUse::LoadBalancer) {
        if s.allowed_uses.len() > 1 {
            ctx.err(
                "spec.allowedUses",
                "LoadBalancer cannot be combined with Workload or Tunnel allowed uses",
            );
        }
        if encap_on(s.ipip_mode) || encap_on(s.vxlan_mode) {
            ctx.err(
                "spec.allowedUses",
                "LoadBalancer IP pool cannot have IPIP or VXLAN enabled",
            );
        }
        if s.disable_bgp_export {
            ctx.err(
                "spec.disableBGPExport",
                "LoadBalancer IP pools cannot disable BGP export",
            );
        }
    }
    for (path, sel) in [
        ("spec.nodeSelector", &s.node_selector),
        ("spec.namespaceSelector", &s.namespace_selector),
    ] {
        if !sel.is_empty() {
            ctx.selector(path, Some(sel), true);
        }
    }
}
