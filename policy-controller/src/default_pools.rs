//! The default IP pools the controller creates from flags, as calico-node does from its install
//! options (`CALICO_IPV4POOL_CIDR`, `CALICO_IPV4POOL_NAT_OUTGOING`, `CALICO_IPV6POOL_CIDR`,
//! `CALICO_IPV6POOL_NAT_OUTGOING`): `default-ipv4-ippool` (natOutgoing by default) and
//! `default-ipv6-ippool` (no NAT by default), block sizes 26 / 122, `nodeSelector: all()`.
//!
//! They are desired state like a manifest's resources, with lower precedence: a manifest that
//! defines an IPPool of the same name wins (that is how an operator changes the default pool).

use calc_graph::model::{IpPool, IpPoolSpec, Metadata, Resource, Validated};

use crate::convert::CalicoResource;

/// Calico's name for the IPv4 default pool.
pub const DEFAULT_IPV4_POOL: &str = "default-ipv4-ippool";
/// Calico's name for the IPv6 default pool.
pub const DEFAULT_IPV6_POOL: &str = "default-ipv6-ippool";

/// A default pool flag that does not give a valid pool (names the flag and its value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefaultPoolError {
    #[error("{flag} {cidr}: not an IPv{family} CIDR")]
    WrongFamily {
        flag: &'static str,
        cidr: String,
        family: u8,
    },
    #[error("{flag} {cidr}: {problems}")]
    Invalid {
        flag: &'static str,
        cidr: String,
        /// The model's validation errors, `; `-joined.
        problems: String,
    },
}

/// What the flags ask for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DefaultPools {
    pub ipv4_cidr: Option<String>,
    pub ipv4_nat_outgoing: bool,
    pub ipv6_cidr: Option<String>,
    pub ipv6_nat_outgoing: bool,
}

impl DefaultPools {
    /// The pools to store, validated as any IPPool; an error names the flag and the problem.
    pub fn resources(&self) -> Result<Vec<(String, CalicoResource)>, DefaultPoolError> {
        let mut out = Vec::new();
        for (flag, name, cidr, nat, v6) in [
            (
                "--default-ipv4-pool-cidr",
                DEFAULT_IPV4_POOL,
                &self.ipv4_cidr,
                self.ipv4_nat_outgoing,
                false,
            ),
            (
                "--default-ipv6-pool-cidr",
                DEFAULT_IPV6_POOL,
                &self.ipv6_cidr,
                self.ipv6_nat_outgoing,
                true,
            ),
        ] {
            let Some(cidr) = cidr else { continue };
            let family_ok = cidr
                .parse::<ipnet::IpNet>()
                .map(|n| n.addr().is_ipv6() == v6)
                .unwrap_or(true);
            if !family_ok {
                return Err(DefaultPoolError::WrongFamily {
                    flag,
                    cidr: cidr.clone(),
                    family: if v6 { 6 } else { 4 },
                });
            }
            let pool = Resource::IpPool(IpPool {
                metadata: Metadata::named(name),
                spec: IpPoolSpec {
                    cidr: cidr.clone(),
                    nat_outgoing: nat,
                    block_size: if v6 { 122 } else { 26 },
                    node_selector: "all()".into(),
                    ..IpPoolSpec::default()
                },
                status: None,
            });
            let valid = Validated::of(pool).map_err(|errs| DefaultPoolError::Invalid {
                flag,
                cidr: cidr.clone(),
                problems: (errs.iter().map(ToString::to_string))
                    .collect::<Vec<_>>()
                    .join("; "),
            })?;
            out.push((valid.key().etcd_key(), CalicoResource::new(valid, None)));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_from_flags_as_calico_names_them() {
        let d = DefaultPools {
            ipv4_cidr: Some("10.244.0.0/16".into()),
            ipv4_nat_outgoing: true,
            ipv6_cidr: Some("fd00:10:244::/48".into()),
            ipv6_nat_outgoing: false,
        };
        let r = d.resources().unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0].0,
            "/calico/resources/v3/projectcalico.org/ippools/default-ipv4-ippool"
        );
        assert_eq!(
            r[0].1.to_json(),
            r#"{"apiVersion":"projectcalico.org/v3","kind":"IPPool","metadata":{"name":"default-ipv4-ippool"},"spec":{"cidr":"10.244.0.0/16","natOutgoing":true,"blockSize":26,"nodeSelector":"all()"}}"#
        );
        assert!(r[1].1.to_json().contains(r#""cidr":"fd00:10:244::/48""#));
        assert!(!r[1].1.to_json().contains("natOutgoing"));
        assert!(DefaultPools::default().resources().unwrap().is_empty());
    }

    #[test]
    fn bad_flags_are_named() {
        let bad = |c: &str| {
            DefaultPools {
                ipv4_cidr: Some(c.into()),
                ..DefaultPools::default()
            }
            .resources()
            .unwrap_err()
            .to_string()
        };
        assert_eq!(
            bad("10.0.0.0/28"),
            "--default-ipv4-pool-cidr 10.0.0.0/28: ippools/default-ipv4-ippool: spec.cidr: IP pool size is too small for use with Calico IPAM: /28 is smaller than the block size /26"
        );
        assert!(bad("nope").contains("invalid CIDR"), "{}", bad("nope"));
        assert_eq!(
            bad("fd00::/48"),
            "--default-ipv4-pool-cidr fd00::/48: not an IPv4 CIDR"
        );
    }
}
