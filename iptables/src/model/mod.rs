//! Typed iptables tables, chains and rules.
