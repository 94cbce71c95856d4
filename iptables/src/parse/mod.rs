//! Parser of iptables-save output.
