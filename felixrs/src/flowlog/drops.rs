//! The kernel's own count of messages it dropped at one of our netlink sockets because its
//! receive buffer was full: the `Drops` column of `/proc/<thread>/net/netlink`, found by the
//! socket's inode. `receive_errors` counts overrun *events* (one `ENOBUFS` each, however many
//! messages were lost); this counts the messages, so a loss under load is a number on
//! `/metrics`, not a guess from what a load generator sent.

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

/// The inode of `socket` (what `/proc/net/netlink` lists it by); `None` if `/proc` is not there.
pub fn socket_inode(socket: &impl AsRawFd) -> Option<u64> {
    std::fs::metadata(format!("/proc/self/fd/{}", socket.as_raw_fd()))
        .ok()
        .map(|m| m.ino())
}

/// The `Drops` of the socket with `inode` in a `/proc/net/netlink` table.
pub fn drops_in(table: &str, inode: u64) -> Option<u64> {
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next()?.split_whitespace().collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (drops, ino) = (col("Drops")?, col("Inode")?);
    lines.find_map(|line| {
        let cells: Vec<&str> = line.split_whitespace().collect();
        (cells.get(ino)?.parse::<u64>().ok()? == inode)
            .then(|| cells.get(drops)?.parse().ok())
            .flatten()
    })
}

/// The netlink table of the calling thread's network namespace (the collector's sockets live
/// there).
pub fn read_table() -> Option<String> {
    std::fs::read_to_string("/proc/thread-self/net/netlink")
        .or_else(|_| std::fs::read_to_string("/proc/self/net/netlink"))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode
00000000749eec62 0   0          00000000 0        0        0     2        0        4
0000000023dd305a 12  4026531    00000004 0        0        0     2        87859    1519
";

    #[test]
    fn drops_are_read_by_inode_and_a_missing_socket_is_none() {
        assert_eq!(drops_in(TABLE, 1519), Some(87_859));
        assert_eq!(drops_in(TABLE, 4), Some(0));
        assert_eq!(drops_in(TABLE, 5), None);
        assert_eq!(drops_in("garbage", 4), None);
    }
}
