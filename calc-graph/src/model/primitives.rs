//! Small value types shared by the resource model and the dataplane-facing `proto` types.
//!
//! JSON forms follow Calico's `numorstring` package: a protocol is a name (`"TCP"`) or a number
//! (`6`); a port is a number (`80`), a range string (`"80:90"`) or a name (`"http"`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A rule's action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Action {
    Allow,
    Deny,
    Pass,
    Log,
}

/// IP version 4 or 6 (JSON: the integer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpVersion {
    V4,
    V6,
}

impl IpVersion {
    pub fn number(self) -> u8 {
        match self {
            IpVersion::V4 => 4,
            IpVersion::V6 => 6,
        }
    }
}

impl Serialize for IpVersion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(self.number())
    }
}

impl<'de> Deserialize<'de> for IpVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match u8::deserialize(d)? {
            4 => Ok(IpVersion::V4),
            6 => Ok(IpVersion::V6),
            n => Err(serde::de::Error::custom(format!(
                "ipVersion must be 4 or 6, got {n}"
            ))),
        }
    }
}

/// An IP protocol, by Calico name or by number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
    Icmp,
    IcmpV6,
    UdpLite,
    Number(u8),
}

impl Protocol {
    /// The IANA protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
            Protocol::Icmp => 1,
            Protocol::IcmpV6 => 58,
            Protocol::UdpLite => 136,
            Protocol::Number(n) => n,
        }
    }

    /// The name as Calico writes it in JSON (`TCP`, `ICMPv6`, ...), or `None` for numeric protocols.
    pub fn calico_name(self) -> Option<&'static str> {
        Some(match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
            Protocol::Icmp => "ICMP",
            Protocol::IcmpV6 => "ICMPv6",
            Protocol::UdpLite => "UDPLite",
            Protocol::Number(_) => return None,
        })
    }

    /// Whether the protocol has ports (and so may be used with `ports`/`notPorts`).
    pub fn supports_ports(self) -> bool {
        matches!(
            self,
            Protocol::Tcp | Protocol::Udp | Protocol::Sctp | Protocol::UdpLite
        ) || matches!(self, Protocol::Number(6 | 17 | 132 | 136))
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.calico_name() {
            Some(n) => f.write_str(n),
            None => write!(f, "{}", self.number()),
        }
    }
}

/// A text that is not a protocol, port or port range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrimitiveError {
    #[error("unknown protocol {0:?}")]
    Protocol(String),
    #[error("invalid port range {0:?}")]
    PortRange(String),
    #[error("empty port")]
    EmptyPort,
}

impl FromStr for Protocol {
    type Err = PrimitiveError;
    /// Accepts Calico's names case-insensitively (`TCP`, `tcp`, `ICMPv6`, `UDPLite`) and numbers.
    fn from_str(s: &str) -> Result<Self, PrimitiveError> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            "sctp" => Protocol::Sctp,
            "icmp" => Protocol::Icmp,
            "icmpv6" => Protocol::IcmpV6,
            "udplite" => Protocol::UdpLite,
            other => match other.parse::<u8>() {
                Ok(n) => Protocol::Number(n),
                Err(_) => return Err(PrimitiveError::Protocol(s.to_string())),
            },
        })
    }
}

impl Serialize for Protocol {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.calico_name() {
            Some(n) => s.serialize_str(n),
            None => s.serialize_u8(self.number()),
        }
    }
}

impl<'de> Deserialize<'de> for Protocol {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NumOrString::deserialize(d)? {
            NumOrString::Num(n) => u8::try_from(n).map(Protocol::Number).map_err(|_| {
                serde::de::Error::custom(format!("protocol number {n} is out of range 0-255"))
            }),
            NumOrString::Str(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// One entry of a rule's `ports` / `notPorts`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Port {
    /// A single port number.
    Number(u16),
    /// An inclusive range `first:last`. Validation rejects `first > last`.
    Range(u16, u16),
    /// A named port, resolved per endpoint through its declared ports.
    Named(String),
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Port::Number(n) => write!(f, "{n}"),
            Port::Range(a, b) => write!(f, "{a}:{b}"),
            Port::Named(n) => f.write_str(n),
        }
    }
}

impl FromStr for Port {
    type Err = PrimitiveError;
    fn from_str(s: &str) -> Result<Self, PrimitiveError> {
        if let Some((a, b)) = s.split_once(':') {
            let range = || PrimitiveError::PortRange(s.to_string());
            let a = a.trim().parse::<u16>().map_err(|_| range())?;
            let b = b.trim().parse::<u16>().map_err(|_| range())?;
            return Ok(Port::Range(a, b));
        }
        if let Ok(n) = s.parse::<u16>() {
            return Ok(Port::Number(n));
        }
        if s.is_empty() {
            return Err(PrimitiveError::EmptyPort);
        }
        Ok(Port::Named(s.to_string()))
    }
}

impl Serialize for Port {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Port::Number(n) => s.serialize_u16(*n),
            other => s.serialize_str(&other.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NumOrString::deserialize(d)? {
            NumOrString::Num(n) => u16::try_from(n)
                .map(Port::Number)
                .map_err(|_| serde::de::Error::custom(format!("port {n} is out of range 0-65535"))),
            NumOrString::Str(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// ICMP type and optional code (`icmp` / `notICMP` in a rule).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct IcmpFields {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<u8>,
}

/// A number or a string (a protocol or a port). Read with its own visitor, not
/// `#[serde(untagged)]`: that buffers the value and builds (and drops) an error for each variant
/// it tries before the one that fits, on every successful decode of a string.
enum NumOrString {
    Num(i64),
    Str(String),
}

impl<'de> Deserialize<'de> for NumOrString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NumOrStringVisitor)
    }
}

struct NumOrStringVisitor;

impl serde::de::Visitor<'_> for NumOrStringVisitor {
    type Value = NumOrString;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number or a string")
    }
    fn visit_i64<E>(self, n: i64) -> Result<NumOrString, E> {
        Ok(NumOrString::Num(n))
    }
    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<NumOrString, E> {
        i64::try_from(n)
            .map(NumOrString::Num)
            .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(n), &self))
    }
    fn visit_str<E>(self, s: &str) -> Result<NumOrString, E> {
        Ok(NumOrString::Str(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<NumOrString, E> {
        Ok(NumOrString::Str(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_json_names_and_numbers() {
        let p: Protocol = serde_json::from_str("\"TCP\"").unwrap();
        assert_eq!(p, Protocol::Tcp);
        let p: Protocol = serde_json::from_str("\"ICMPv6\"").unwrap();
        assert_eq!(p, Protocol::IcmpV6);
        let p: Protocol = serde_json::from_str("132").unwrap();
        assert_eq!(p, Protocol::Number(132));
        assert_eq!(
            serde_json::to_string(&Protocol::UdpLite).unwrap(),
            "\"UDPLite\""
        );
        assert!(serde_json::from_str::<Protocol>("\"bogus\"").is_err());
        assert!(serde_json::from_str::<Protocol>("256").is_err());
    }

    #[test]
    fn port_json_forms() {
        let p: Vec<Port> = serde_json::from_str(r#"[80, "81", "90:100", "http"]"#).unwrap();
        assert_eq!(
            p,
            vec![
                Port::Number(80),
                Port::Number(81),
                Port::Range(90, 100),
                Port::Named("http".into())
            ]
        );
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"[80,81,"90:100","http"]"#
        );
        assert!(serde_json::from_str::<Port>("70000").is_err());
        assert!(serde_json::from_str::<Port>("\"1:x\"").is_err());
    }

    #[test]
    fn ip_version_json() {
        assert_eq!(
            serde_json::from_str::<IpVersion>("6").unwrap(),
            IpVersion::V6
        );
        assert!(serde_json::from_str::<IpVersion>("5").is_err());
    }
}
