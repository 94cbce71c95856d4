//! A legacy (x_tables) table's summary from the kernel: `IPT_SO_GET_INFO` / `IP6T_SO_GET_INFO`
//! (`linux/netfilter_ipv4/ip_tables.h`, `linux/netfilter_ipv6/ip6_tables.h`), a `getsockopt` on
//! a raw socket of the family answering with the table's entry count, blob size and hook
//! offsets in microseconds, where `iptables-legacy-save` takes a few hundred milliseconds on a
//! large node. The only unsafe code of the crate: libc has the socket calls but no safe wrapper
//! for a `getsockopt` whose buffer carries input (the table's name).
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
        Ok(XtInfo { socket, family })
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
        if table.len() >= NAME_LEN || table.contains('\0') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("table name {table:?} is not a kernel table name"),
            ));
        }
        let mut info = GetInfo {
            name: [0; NAME_LEN],
            valid_hooks: 0,
            hook_entry: [0; HOOKS],
            underflow: [0; HOOKS],
            num_entries: 0,
            size: 0,
        };
        info.name[..table.len()].copy_from_slice(table.as_bytes());
        let level = match self.family {
            IpVersion::V4 => libc::SOL_IP,
            IpVersion::V6 => libc::SOL_IPV6,
        };
        let mut len = std::mem::size_of::<GetInfo>() as libc::socklen_t;
        // SAFETY: the buffer is a live, exclusively borrowed `GetInfo` (plain integers, any bit
        // pattern valid) of exactly `len` bytes, the size the kernel checks for this option and
        // writes at most; `len` is a live socklen_t the kernel may update.
        let rc = unsafe {
            libc::getsockopt(
                self.socket.as_raw_fd(),
                level,
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
}
