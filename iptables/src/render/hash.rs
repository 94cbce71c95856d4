//! Felix's rule hash (`felix/generictables/rules.go`) and comment escaping (`iptables/renderer.go`).
//!
//! Invariants: `rule_hashes` is a pure function of the chain name and each rule's Felix-syntax text
//! (`-A <chain> HASH <comments> <match> <action>`); changing one rule changes its hash and every hash
//! after it. Ids are 16 characters of unpadded base64url, so they never need quoting.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha224};

/// Length of the `cali:<id>` rule id.
pub const HASH_LENGTH: usize = 16;
/// Longest human comment we write. Felix cuts at 256, but the kernel keeps only 255 bytes and
/// re-saves the shorter text, so we cut at 255 to make the saved rule equal the desired one.
pub const MAX_COMMENT_LEN: usize = 255;

/// The hash ids of a chain's rules, given each rule's Felix-syntax body (the text after
/// `-A <chain> HASH `, e.g. `--jump DROP`; an empty body hashes as `-A <chain> HASH`).
pub fn rule_hashes<'a>(chain: &str, bodies: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut hash = Sha224::digest(chain.as_bytes());
    let mut out = Vec::new();
    let mut line = String::new();
    for body in bodies {
        line.clear();
        line.push_str("-A ");
        line.push_str(chain);
        line.push_str(" HASH");
        if !body.is_empty() {
            line.push(' ');
            line.push_str(body);
        }
        let mut h = Sha224::new();
        h.update(hash);
        h.update(line.as_bytes());
        hash = h.finalize();
        let mut id = URL_SAFE_NO_PAD.encode(hash);
        id.truncate(HASH_LENGTH);
        out.push(id);
    }
    out
}

/// Felix's `escapeComment` + `truncateComment`: every character outside `[A-Za-z0-9_ @%+=:,./-]`
/// becomes `_`, then the result is cut to 255 bytes. The output can never contain a quote,
/// backslash, newline or any other byte that could end the comment token in restore text.
pub fn escape_comment(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || " _@%+=:,./-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    // Only ASCII remains, so any byte index is a char boundary.
    out.truncate(MAX_COMMENT_LEN);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn felix_table_test_vectors_reproduce() {
        // felix/iptables/table_test.go, as recorded in felix-reference §5.6.
        assert_eq!(
            rule_hashes("FORWARD", ["--jump DROP"]),
            ["hecdSCslEjdBPBPo"]
        );
        assert_eq!(
            rule_hashes(
                "FORWARD",
                [
                    "--jump DROP",
                    "--jump ACCEPT",
                    "--jump DROP",
                    "--jump ACCEPT"
                ]
            ),
            [
                "hecdSCslEjdBPBPo",
                "plvr29-ZiKUwbzDV",
                "BMJ7gfua-eMLZ8Gu",
                "rmnR1gc8haxMy_0W"
            ]
        );
        assert_eq!(
            rule_hashes("cali-foobar", ["--jump ACCEPT", "--jump DROP"]),
            ["42h7Q64_2XDzpwKe", "0sUFHicPNNqNyNx8"]
        );
        assert_eq!(
            rule_hashes("FORWARD", ["--jump cali-FORWARD"]),
            ["wUHhoiAYhphO9Mso"]
        );
    }

    #[test]
    fn escaping_keeps_safe_characters_and_replaces_the_rest() {
        assert_eq!(
            escape_comment("NetworkPolicy prod/web ingress"),
            "NetworkPolicy prod/web ingress"
        );
        assert_eq!(escape_comment("a\"b\n-j ACCEPT'é"), "a_b_-j ACCEPT__");
        assert_eq!(escape_comment(&"x".repeat(300)).len(), 255);
        assert_eq!(escape_comment(&"é".repeat(300)).len(), 255);
    }
}
