//! Did anything change in the kernel's tables since we last looked? The drift check's cheap first
//! question, one answer per backend:
//! * nft: the ruleset generation id (`NFT_MSG_GETGEN` on a netfilter netlink socket, what `nft
//!   monitor` and iptables-nft use): the kernel bumps it on every committed transaction, ours
//!   included, of any table and family; each restore of ours is one, so the applier subtracts
//!   the count of its own. One request, one small reply; no table is read.
//! * legacy: no generation and no notifications. Two signals, both read in the caller's own
//!   namespace:
//!   - fast, every check: each of our tables' entry count, blob size and hook offsets
//!     ([`XtInfo`], `IPT_SO_GET_INFO`: microseconds), hashed ([`legacy_info`]). Every rule or
//!     chain added or deleted (flush, insert, delete, chain create/delete) moves it; an edit in
//!     place that keeps the blob's size (one rule's `DROP` -> `ACCEPT`) does not.
//!   - slower, on a budgeted cadence: the tables' contents, every entry's bytes but its
//!     counters ([`XtInfo::contents_hash`], `IPT_SO_GET_ENTRIES`), hashed with the summaries
//!     ([`legacy_contents`]; about 60 ms of CPU per family at 2,000 policies, nearly all of it
//!     the kernel's copy, a third of what hashing the save cost), which catches those edits
//!     too.
//!
//!   Where the applier's programs run in another namespace the save is hashed on every check
//!   ([`save_hash`], the only signal there). The same save text is parsed only when a signal
//!   moved.

use std::hash::{Hash, Hasher};

use netlink_sys::{Socket, SocketAddr, constants::NETLINK_NETFILTER};

use super::xt_info::XtInfo;
use crate::desired::TableName;

/// `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETGEN`.
const GETGEN: u16 = (10 << 8) | 16;
const NLMSG_ERROR: u16 = 2;
const NFTA_GEN_ID: u16 = 1;

/// A netfilter netlink socket in the caller's network namespace, asking for the generation id.
pub struct NftGeneration {
    socket: Socket,
    seq: u32,
}

impl NftGeneration {
    pub fn open() -> std::io::Result<Self> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(NftGeneration { socket, seq: 0 })
    }

    /// The ruleset's generation id now.
    pub fn get(&mut self) -> std::io::Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        // nlmsghdr (len, type, flags = NLM_F_REQUEST, seq, port) + nfgenmsg (AF_UNSPEC, v0, 0).
        let mut req = Vec::with_capacity(20);
        req.extend_from_slice(&20u32.to_ne_bytes());
        req.extend_from_slice(&GETGEN.to_ne_bytes());
        req.extend_from_slice(&1u16.to_ne_bytes());
        req.extend_from_slice(&self.seq.to_ne_bytes());
        req.extend_from_slice(&[0; 8]);
        self.socket.send(&req, 0)?;
        let bad = |what: &str| std::io::Error::other(format!("nft generation reply: {what}"));
        loop {
            let mut buf = Vec::with_capacity(256);
            self.socket.recv(&mut buf, 0)?;
            let msg = &buf[..];
            let u16_at = |i: usize| msg.get(i..i + 2).map(|b| u16::from_ne_bytes([b[0], b[1]]));
            let u32_at = |i: usize| {
                msg.get(i..i + 4)
                    .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            };
            if u32_at(8) != Some(self.seq) {
                continue; // a late reply to an earlier request
            }
            match u16_at(4) {
                Some(NLMSG_ERROR) => {
                    let code = u32_at(16).ok_or_else(|| bad("short error"))? as i32;
                    return Err(std::io::Error::from_raw_os_error(-code));
                }
                Some(_) => {}
                None => return Err(bad("short message")),
            }
            // Attributes after the 16-byte header and the 4-byte nfgenmsg, 4-byte aligned.
            let mut at = 20;
            while let (Some(len), Some(kind)) = (u16_at(at), u16_at(at + 2)) {
                if kind & 0x3fff == NFTA_GEN_ID {
                    // Network byte order, as every nftables attribute.
                    return u32_at(at + 4)
                        .map(u32::from_be)
                        .ok_or_else(|| bad("short id"));
                }
                if len < 4 {
                    break;
                }
                at += (usize::from(len) + 3) & !3;
            }
            return Err(bad("no generation id"));
        }
    }
}

/// The legacy tables' fast signal: for each table the kernel has of those we plan
/// ([`TableName::ALL`], found in [`XtInfo::names_file`]: asking for another would create it),
/// its name and summary, hashed. Microseconds.
pub fn legacy_info(xt: &XtInfo) -> std::io::Result<u64> {
    let names = std::fs::read_to_string(xt.names_file())?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for table in TableName::ALL {
        if !names.lines().any(|n| n == table.as_str()) {
            continue;
        }
        table.hash(&mut h);
        match xt.get(table.as_str()) {
            Ok(info) => Some(info).hash(&mut h),
            // Gone since the list was read: a value too.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None::<()>.hash(&mut h),
            Err(e) => return Err(e),
        }
    }
    Ok(h.finish())
}

/// The legacy tables' signal the drift check asks: [`legacy_info`]'s summaries and each table's
/// rules themselves ([`XtInfo::contents_hash`], counters left out), hashed together, so an edit
/// in place that keeps a table's size moves it too. A few milliseconds per family at 2,000
/// policies (the kernel's copy of the blob and a word hash over it).
pub fn legacy_contents(xt: &mut XtInfo) -> std::io::Result<u64> {
    let names = std::fs::read_to_string(xt.names_file())?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for table in TableName::ALL {
        if !names.lines().any(|n| n == table.as_str()) {
            continue;
        }
        table.hash(&mut h);
        // A table changing size between the two questions: ask both again.
        let mut tries = 0;
        let value = loop {
            let info = match xt.get(table.as_str()) {
                Ok(info) => info,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break None,
                Err(e) => return Err(e),
            };
            match xt.contents_hash(table.as_str(), info.size) {
                Ok(rules) => break Some((info, rules)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break None,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && tries < 3 => tries += 1,
                Err(e) => return Err(e),
            }
        };
        value.hash(&mut h);
    }
    Ok(h.finish())
}

/// The hash of a save's text without what changes by itself: its `#` comments (timestamps) and
/// the built-in chains' packet counters (`:INPUT ACCEPT [12:3456]`).
pub fn save_hash(text: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let line = match line.strip_prefix(':').and_then(|l| l.rsplit_once(" [")) {
            Some((chain, _)) => chain,
            None => line,
        };
        line.hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::save_hash;

    #[test]
    fn a_save_hash_ignores_timestamps_and_chain_counters_only() {
        let a =
            "# Generated on Mon\n*filter\n:INPUT ACCEPT [1:2]\n-A INPUT -j cali-INPUT\nCOMMIT\n";
        let b =
            "# Generated on Tue\n*filter\n:INPUT ACCEPT [9:99]\n-A INPUT -j cali-INPUT\nCOMMIT\n";
        assert_eq!(save_hash(a), save_hash(b));
        assert_ne!(save_hash(a), save_hash(&a.replace("cali-INPUT", "ACCEPT")));
        assert_ne!(save_hash(a), save_hash(&a.replace("ACCEPT [1", "DROP [1")));
    }
}
