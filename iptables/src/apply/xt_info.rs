//! A legacy (x_tables) table's summary and contents from the kernel: `IPT_SO_GET_INFO` /
//! `IP6T_SO_GET_INFO` (`linux/netfilter_ipv4/ip_tables.h`, `linux/netfilter_ipv6/ip6_tables.h`),
//! a `getsockopt` on a raw socket of the family answering with the table's entry count, blob
//! size and hook offsets in microseconds, where `iptables-legacy-save` takes a few hundred
//! milliseconds on a large node; and `IPT_SO_GET_ENTRIES` / `IP6T_SO_GET_ENTRIES`, the rules
//! themselves (the blob the kernel runs), hashed without their counters. The only unsafe code of
//! the crate: libc has the socket calls but no safe wrapper for a `getsockopt` whose buffer
//! carries input (the table's name and size).
#![allow(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::desired::IpVersion;

/// `IPT_SO_GET_INFO` and `IP6T_SO_GET_INFO` (`IPT_BASE_CTL` = `IP6T_BASE_CTL` = 64).
const SO_GET_INFO: libc::c_int = 64;
/// `XT_TABLE_MAXNAMELEN`, the name's NUL included.
const NAME_LEN: usize = 32;
/// `NF_INET_NUMHOOKS`.
const HOOKS: usize = 5;

/// `struct ipt_getinfo` (= `struct ip6t_getinfo`).
#[repr(C)]
struct GetInfo {
    name: [u8; NAME_LEN],
    valid_hooks: u32,
    hook_entry: [u32; HOOKS],
    underflow: [u32; HOOKS],
    num_entries: u32,
    size: u32,
}

const _: () = assert!(std::mem::size_of::<GetInfo>() == 84);
const _: () = assert!(HOOKS == libc::NF_INET_NUMHOOKS as usize);

/// What `SO_GET_INFO` says of a table: every rule or chain added or deleted moves the entry
/// count and the blob size; an edit in place that keeps the size does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TableInfo {
    pub valid_hooks: u32,
    pub hook_entry: [u32; HOOKS],
    pub underflow: [u32; HOOKS],
    pub num_entries: u32,
    pub size: u32,
}

/// A raw socket of one family in the network namespace of the thread that opened it.
#[derive(Debug)]
pub struct XtInfo {
    socket: OwnedFd,
    family: IpVersion,
    /// [`Self::contents_hash`]'s buffer, kept between calls (a large table's blob is megabytes:
    /// allocating and faulting it in again would cost more than the copy). `u64`s: the
    /// kernel's entries are 8-byte aligned.
    buf: Vec<u64>,
}

impl XtInfo {
    pub fn open(family: IpVersion) -> io::Result<Self> {
        let domain = match family {
            IpVersion::V4 => libc::AF_INET,
            IpVersion::V6 => libc::AF_INET6,
        };
        // SAFETY: socket(2) takes no pointers; a non-negative result is a new descriptor that
        // nothing else owns.
        let fd: RawFd = unsafe {
            libc::socket(
                domain,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::IPPROTO_RAW,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is open and owned by nobody else (above).
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(XtInfo {
            socket,
            family,
            buf: Vec::new(),
        })
    }

    pub fn family(&self) -> IpVersion {
        self.family
    }

    /// The kernel's list of this family's legacy tables in the calling thread's namespace.
    /// Asking [`Self::get`] for a table not listed would create it (empty).
    pub fn names_file(&self) -> &'static str {
        match self.family {
            IpVersion::V4 => "/proc/thread-self/net/ip_tables_names",
            IpVersion::V6 => "/proc/thread-self/net/ip6_tables_names",
        }
    }

    /// `table`'s summary; an error of kind `NotFound` (ENOENT) when the kernel has no such
    /// table, `PermissionDenied` without CAP_NET_ADMIN.
    pub fn get(&self, table: &str) -> io::Result<TableInfo> {
        check_name(table)?;
        let mut info = GetInfo {
            name: [0; NAME_LEN],
            valid_hooks: 0,
            hook_entry: [0; HOOKS],
            underflow: [0; HOOKS],
            num_entries: 0,
            size: 0,
        };
        info.name[..table.len()].copy_from_slice(table.as_bytes());
        let mut len = std::mem::size_of::<GetInfo>() as libc::socklen_t;
        // SAFETY: the buffer is a live, exclusively borrowed `GetInfo` (plain integers, any bit
        // pattern valid) of exactly `len` bytes, the size the kernel checks for this option and
        // writes at most; `len` is a live socklen_t the kernel may update.
        let rc = unsafe {
            libc::getsockopt(
                self.socket.as_raw_fd(),
                self.level(),
                SO_GET_INFO,
                (&mut info as *mut GetInfo).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        if len as usize != std::mem::size_of::<GetInfo>() {
            return Err(io::Error::other(format!(
                "table {table}: SO_GET_INFO answered {len} bytes, not {}",
                std::mem::size_of::<GetInfo>()
            )));
        }
        Ok(TableInfo {
            valid_hooks: info.valid_hooks,
            hook_entry: info.hook_entry,
            underflow: info.underflow,
            num_entries: info.num_entries,
            size: info.size,
        })
    }

    /// A hash of `table`'s rules as the kernel holds them (`IPT_SO_GET_ENTRIES` /
    /// `IP6T_SO_GET_ENTRIES`: the whole blob, every entry's matches and target, its packet and
    /// byte counters left out, as they move by themselves): any edit moves it, one that keeps
    /// the blob's size too (a rule replaced in place, `-j DROP` -> `-j ACCEPT`, a port changed).
    /// `size` is the blob size [`Self::get`] reported; an error of kind `WouldBlock` (EAGAIN)
    /// when the table changed size since (ask again). A few milliseconds for a 16 MB table.
    pub fn contents_hash(&mut self, table: &str, size: u32) -> io::Result<u64> {
        check_name(table)?;
        let total = ENTRIES_HEADER + size as usize;
        // Not cleared: the kernel writes every byte up to `total`, or the call fails.
        self.buf.resize(total.div_ceil(8), 0);
        let bytes = u64s_as_bytes_mut(&mut self.buf);
        bytes[..table.len()].copy_from_slice(table.as_bytes());
        bytes[NAME_LEN..NAME_LEN + 4].copy_from_slice(&size.to_ne_bytes());
        let mut len = total as libc::socklen_t;
        // SAFETY: the buffer is live, exclusively borrowed and at least `len` bytes long (it
        // holds `total.div_ceil(8)` u64s), any bit pattern valid; the kernel checks that `len`
        // is its header plus the `size` it names and writes at most `len` bytes; `len` is a live
        // socklen_t the kernel may update.
        let rc = unsafe {
            libc::getsockopt(
                self.socket.as_raw_fd(),
                self.level(),
                SO_GET_ENTRIES,
                self.buf.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let bytes = &u64s_as_bytes_mut(&mut self.buf)[..total];
        entries_hash(self.family, &bytes[ENTRIES_HEADER..]).ok_or_else(|| {
            io::Error::other(format!(
                "table {table}: SO_GET_ENTRIES answered a malformed entry table"
            ))
        })
    }

    fn level(&self) -> libc::c_int {
        match self.family {
            IpVersion::V4 => libc::SOL_IP,
            IpVersion::V6 => libc::SOL_IPV6,
        }
    }
}

/// `IPT_SO_GET_ENTRIES` and `IP6T_SO_GET_ENTRIES`.
const SO_GET_ENTRIES: libc::c_int = 65;

/// `struct ipt_get_entries` / `struct ip6t_get_entries` before the entry table: the name, the
/// size (u32), padded to the entries' 8-byte alignment.
const ENTRIES_HEADER: usize = 40;

/// The buffer as bytes.
fn u64s_as_bytes_mut(buf: &mut [u64]) -> &mut [u8] {
    let len = std::mem::size_of_val(buf);
    // SAFETY: a u64 slice is `len` initialised bytes; u8 has no alignment and every bit
    // pattern is valid; the returned slice borrows `buf` exclusively for its lifetime.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), len) }
}

fn check_name(table: &str) -> io::Result<()> {
    if table.len() >= NAME_LEN || table.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("table name {table:?} is not a kernel table name"),
        ));
    }
    Ok(())
}

/// Where an entry's `next_offset` (u16) and its counters (two u64) are: `struct ipt_entry` is a
/// 84-byte `ipt_ip`, then `nfcache` u32, `target_offset` u16, `next_offset` u16, `comefrom`
/// u32, counters at 96; `struct ip6t_entry` a 136-byte `ip6t_ip6`, the same fields, counters
/// at 152 (8-aligned).
fn entry_layout(family: IpVersion) -> (usize, usize) {
    match family {
        IpVersion::V4 => (90, 96),
        IpVersion::V6 => (142, 152),
    }
}

/// The counters' size in an entry (`struct xt_counters`).
const COUNTERS: usize = 16;

/// A hash of an entry table (the blob after the `get_entries` header) without each entry's
/// counters; `None` when an entry's `next_offset` does not walk the blob.
pub fn entries_hash(family: IpVersion, blob: &[u8]) -> Option<u64> {
    let (next_at, counters_at) = entry_layout(family);
    let mut h = WordHash::default();
    let mut at = 0;
    while at < blob.len() {
        let entry = &blob[at..];
        let next = usize::from(u16::from_ne_bytes([
            *entry.get(next_at)?,
            *entry.get(next_at + 1)?,
        ]));
        if next < counters_at + COUNTERS || next > entry.len() {
            return None;
        }
        h.bytes(&entry[..counters_at]);
        h.bytes(&entry[counters_at + COUNTERS..next]);
        at += next;
    }
    Some(h.0)
}

/// A fast hash of bytes, eight at a time (FxHash's mixing): GB/s, so a 16 MB table costs
/// milliseconds. Not collision-resistant against someone choosing the bytes (who holds
/// CAP_NET_ADMIN anyway); the full refresh stays the backstop.
#[derive(Default)]
struct WordHash(u64);

impl WordHash {
    fn word(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn bytes(&mut self, b: &[u8]) {
        let mut words = b.chunks_exact(8);
        for w in &mut words {
            let mut x = [0u8; 8];
            x.copy_from_slice(w);
            self.word(u64::from_ne_bytes(x));
        }
        let rest = words.remainder();
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        self.word(u64::from_ne_bytes(last) ^ ((rest.len() as u64) << 56));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two v4 entries (112-byte header, no matches, an 8-byte target): the counters move
    /// nothing, a byte of a target does; a `next_offset` out of the blob is malformed.
    #[test]
    fn the_entries_hash_skips_counters_only() {
        let mut blob = vec![0u8; 240];
        for at in [0, 120] {
            blob[at + 90..at + 92].copy_from_slice(&120u16.to_ne_bytes());
            blob[at + 112] = 7;
        }
        let h = entries_hash(IpVersion::V4, &blob).unwrap();
        let mut counted = blob.clone();
        counted[120 + 96..120 + 112].fill(0xff);
        assert_eq!(entries_hash(IpVersion::V4, &counted), Some(h));
        let mut edited = blob.clone();
        edited[120 + 113] = 1;
        assert_ne!(entries_hash(IpVersion::V4, &edited), Some(h));
        let mut bad = blob.clone();
        bad[120 + 90..120 + 92].copy_from_slice(&200u16.to_ne_bytes());
        assert_eq!(entries_hash(IpVersion::V4, &bad), None);
        assert_eq!(entries_hash(IpVersion::V4, &blob[..200]), None);
    }
}
