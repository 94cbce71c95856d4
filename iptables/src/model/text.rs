//! Validated string pieces of a rule and their iptables-restore spelling.
//!
//! Invariant: every value here renders to text that `iptables-restore` tokenises back into exactly
//! the same value, so nothing stored in the model (a comment, a set name, a hostile label copied into
//! a comment) can add, remove or change options of a restore payload.
//!
//! * [`Text`]: a free-form string argument (comment, log prefix). Rendered the way the kernel's
//!   `xtables_save_string` does: bare when it is only `[A-Za-z0-9_-]`, else double-quoted with `"`, `\`
//!   and `'` backslash-escaped. Newlines, carriage returns and NULs are **rejected**: the restore format
//!   has no escape for them (restore reads line by line), so they could only end the command early.
//! * [`Word`]: a bare token (set names, generic option values, target names): no whitespace, no
//!   control characters, no `"`; never quoted (restore takes `'` and `\` literally outside quotes).
//! * [`ChainName`], [`Iface`], [`SetName`]: words with the kernel's length limits.
//! * [`Arg`]: one option token of a generic (untyped) match or target, remembering whether the source
//!   quoted it so that the kernel's spelling is reproduced exactly.

use std::fmt;
use std::sync::Arc;

use super::ModelError;

/// Longest token `iptables-restore` accepts (its parameter buffer is 1024 bytes with the NUL).
pub const MAX_TOKEN_LEN: usize = 1023;
/// Longest chain name the kernel accepts (`XT_EXTENSION_MAXNAMELEN` 29 with the NUL).
pub const MAX_CHAIN_NAME_LEN: usize = 28;
/// Longest interface name (`IFNAMSIZ` 16 with the NUL).
pub const MAX_IFACE_LEN: usize = 15;
/// Longest ipset name (`IPSET_MAXNAMELEN` 32 with the NUL).
pub const MAX_SET_NAME_LEN: usize = 31;

/// True for the characters `xtables_save_string` prints without quotes.
fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Appends `v` in decimal (what `{v}` prints, without the formatting machinery: rendering is on
/// the parser's hot path through the canonical check).
pub(crate) fn push_dec(out: &mut String, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend(buf[i..].iter().map(|&b| char::from(b)));
}

/// Appends `v` as `{v:#x}` prints it (`0x` then lowercase hex without leading zeros; `0x0`).
pub(crate) fn push_hex(out: &mut String, v: u32) {
    out.push_str("0x");
    let digits = (32 - v.leading_zeros()).div_ceil(4).max(1);
    for k in (0..digits).rev() {
        out.push(char::from(
            b"0123456789abcdef"[((v >> (k * 4)) & 0xf) as usize],
        ));
    }
}

/// Mask of the high bit of every byte of `x` that is zero (exact, no false positives).
#[inline]
pub(crate) fn zero_bytes(x: u64) -> u64 {
    const LO7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    !(((x & LO7).wrapping_add(LO7)) | x) & !LO7
}

/// Index of the first byte of `b` that is one of `stops` (`b.len()` if none), eight bytes at a
/// time: one well-predicted branch per word instead of a byte loop's per-byte compares (the
/// parser's and renderer's scans of tokens, quoted strings and lines).
#[inline]
pub(crate) fn find_byte_of<const N: usize>(b: &[u8], stops: [u8; N]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let mut n = 0;
    while let Some(w) = b.get(n..n + 8) {
        let x = u64::from_le_bytes(w.try_into().expect("eight bytes"));
        let mut hits = 0;
        for s in stops {
            hits |= zero_bytes(x ^ (u64::from(s) * ONES));
        }
        if hits != 0 {
            return n + (hits.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    while n < b.len() && !stops.contains(&b[n]) {
        n += 1;
    }
    n
}

/// Appends `s` double-quoted with the kernel's escaping (`"`, `\`, `'` get a backslash).
pub(crate) fn push_quoted(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    // The three escaped characters are ASCII: copy the runs between them whole.
    let mut rest = s;
    loop {
        let i = find_byte_of(rest.as_bytes(), [b'"', b'\\', b'\'']);
        if i == rest.len() {
            break;
        }
        out.push_str(&rest[..i]);
        out.push('\\');
        out.push(char::from(rest.as_bytes()[i]));
        rest = &rest[i + 1..];
    }
    out.push_str(rest);
    out.push('"');
}

/// Appends `s` the way `xtables_save_string` prints it: bare if plain, else quoted.
pub(crate) fn push_save_string(out: &mut String, s: &str) {
    if !s.is_empty() && s.bytes().all(is_plain) {
        out.push_str(s);
    } else {
        push_quoted(out, s);
    }
}

/// A free-form string argument (comment, log prefix); see the module docs for the quoting rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Text(String);

impl Text {
    /// Validates `s`: no newline, carriage return or NUL, at most [`MAX_TOKEN_LEN`] bytes.
    pub fn new(s: impl Into<String>) -> Result<Self, ModelError> {
        let s = s.into();
        // The three are ASCII, so a byte scan finds them (UTF-8 never reuses ASCII bytes).
        if let Some(c) = s
            .bytes()
            .find(|b| matches!(b, b'\n' | b'\r' | 0))
            .map(char::from)
        {
            return Err(ModelError::new(
                "string",
                &s,
                format!("contains {c:?}, which iptables-restore cannot carry"),
            ));
        }
        if s.len() > MAX_TOKEN_LEN {
            return Err(ModelError::new(
                "string",
                &s,
                format!("is longer than {MAX_TOKEN_LEN} bytes"),
            ));
        }
        Ok(Self(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Appends the kernel's spelling (`xtables_save_string`).
    pub fn render_into(&self, out: &mut String) {
        push_save_string(out, &self.0);
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        self.render_into(&mut s);
        f.write_str(&s)
    }
}

fn check_word(what: &'static str, s: &str, max: usize) -> Result<(), ModelError> {
    // Outside quotes iptables-restore splits only at spaces/tabs and opens a quote at `"`;
    // `'` and `\` are literal there, so they are safe in a bare token.
    if s.is_empty() {
        return Err(ModelError::new(what, s, "is empty".to_string()));
    }
    if s.len() > max {
        return Err(ModelError::new(
            what,
            s,
            format!("is longer than {max} bytes"),
        ));
    }
    // Fast path: printable ASCII other than space and `"` is always fine.
    if s.bytes().all(|b| (0x21..0x7f).contains(&b) && b != b'"') {
        return Ok(());
    }
    if let Some(c) = s
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || *c == '"')
    {
        return Err(ModelError::new(what, s, format!("contains {c:?}")));
    }
    Ok(())
}

macro_rules! word_type {
    ($(#[$doc:meta])* $name:ident, $what:literal, $max:expr, $extra:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            pub fn new(s: impl Into<String>) -> Result<Self, ModelError> {
                let s = s.into();
                check_word($what, &s, $max)?;
                let extra: fn(&str) -> Result<(), String> = $extra;
                extra(&s).map_err(|m| ModelError::new($what, &s, m))?;
                Ok(Self(s.into()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = ModelError;
            fn try_from(s: &str) -> Result<Self, ModelError> {
                Self::new(s)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

word_type!(
    /// A bare token: no whitespace, control characters or double quotes.
    Word, "token", MAX_TOKEN_LEN, |_| Ok(())
);

word_type!(
    /// A chain name iptables accepts: 1–28 bytes, a [`Word`], not starting with `-` or `!`, and not a
    /// built-in verdict (`ACCEPT`, `DROP`, `RETURN`, `QUEUE`).
    ChainName, "chain name", MAX_CHAIN_NAME_LEN, |s| {
        if s.contains(['\'', '\\']) {
            return Err("contains a quote or backslash".to_string());
        }
        if s.starts_with('-') || s.starts_with('!') {
            return Err(format!("must not start with {:?}", &s[..1]));
        }
        if matches!(s, "ACCEPT" | "DROP" | "RETURN" | "QUEUE") {
            return Err("is a built-in verdict".to_string());
        }
        Ok(())
    }
);

word_type!(
    /// An interface name for `-i`/`-o`: 1–15 bytes; a trailing `+` is the wildcard.
    Iface, "interface name", MAX_IFACE_LEN, |_| Ok(())
);

word_type!(
    /// An ipset name: 1–31 bytes.
    SetName, "ipset name", MAX_SET_NAME_LEN, |_| Ok(())
);

impl Iface {
    /// True when the name ends in `+` (matches every interface with that prefix).
    pub fn is_wildcard(&self) -> bool {
        self.0.ends_with('+')
    }
}

/// One token of a generic match or target, e.g. `--to-destination`, `10.0.0.1:80`, `!`, `"GET /"`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Arg {
    text: String,
    quoted: bool,
}

impl Arg {
    /// A token printed as is; must be a valid [`Word`].
    pub fn bare(s: impl Into<String>) -> Result<Self, ModelError> {
        let s = s.into();
        check_word("token", &s, MAX_TOKEN_LEN)?;
        Ok(Self {
            text: s,
            quoted: false,
        })
    }

    /// A token always printed in double quotes (the kernel does this for e.g. `--string`).
    pub fn quoted(s: impl Into<String>) -> Result<Self, ModelError> {
        let t = Text::new(s)?;
        Ok(Self {
            text: t.0,
            quoted: true,
        })
    }

    /// The negation token `!`.
    pub fn not() -> Self {
        Self {
            text: "!".to_string(),
            quoted: false,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn is_quoted(&self) -> bool {
        self.quoted
    }

    pub fn render_into(&self, out: &mut String) {
        if self.quoted {
            push_quoted(out, &self.text);
        } else {
            out.push_str(&self.text);
        }
    }
}

impl fmt::Display for Arg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        self.render_into(&mut s);
        f.write_str(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_pushers_match_format() {
        for v in [
            0u32,
            1,
            9,
            10,
            15,
            16,
            255,
            0x10000,
            0xdead_beef,
            u32::MAX,
            1 << 31,
        ] {
            let mut s = String::new();
            push_hex(&mut s, v);
            assert_eq!(s, format!("{v:#x}"));
        }
        for v in [0u64, 1, 9, 10, 99, 100, 65535, 1_000_000, u64::MAX] {
            let mut s = String::new();
            push_dec(&mut s, v);
            assert_eq!(s, v.to_string());
        }
    }

    #[test]
    fn save_string_quoting_matches_kernel() {
        let cases = [
            ("c1", "c1"),
            ("kube-system/dns:dns-tcp", "\"kube-system/dns:dns-tcp\""),
            ("it's", "\"it\\'s\""),
            ("'dapp_OpenSSH'", "\"\\'dapp_OpenSSH\\'\""),
            ("a\\b", "\"a\\\\b\""),
            ("é\"\"x'", "\"é\\\"\\\"x\\'\""),
            ("", "\"\""),
            ("say \"hi\"", "\"say \\\"hi\\\"\""),
            ("café", "\"café\""),
        ];
        for (v, want) in cases {
            assert_eq!(Text::new(v).unwrap().to_string(), want, "{v}");
        }
    }

    #[test]
    fn text_rejects_line_breaks_and_nul() {
        for bad in ["a\nb", "a\rb", "a\0b"] {
            let e = Text::new(bad).unwrap_err().to_string();
            assert!(e.contains("cannot carry"), "{e}");
        }
        assert!(Text::new("x".repeat(MAX_TOKEN_LEN + 1)).is_err());
    }

    #[test]
    fn chain_names_follow_iptables_rules() {
        assert!(ChainName::new("cali-fw-abcdefghijklmnopqrst").is_ok());
        assert!(ChainName::new("ABCDEFGHIJKLMNOPQRSTUVWXYZ12").is_ok());
        for bad in [
            "",
            "ABCDEFGHIJKLMNOPQRSTUVWXYZ123",
            "a b",
            "a\tb",
            "-x",
            "!x",
            "ACCEPT",
            "a\"b",
            "a'b",
            "a\\b",
        ] {
            assert!(ChainName::new(bad).is_err(), "{bad:?} accepted");
        }
        let e = ChainName::new("a b").unwrap_err().to_string();
        assert!(e.starts_with("chain name \"a b\""), "{e}");
    }

    #[test]
    fn iface_limits() {
        assert!(Iface::new("abcdefghijklmno").is_ok());
        assert!(Iface::new("abcdefghijklmnop").is_err());
        assert!(Iface::new("cali+").unwrap().is_wildcard());
    }

    #[test]
    fn args_keep_quoting() {
        assert_eq!(Arg::quoted("GET /").unwrap().to_string(), "\"GET /\"");
        assert_eq!(Arg::quoted("x").unwrap().to_string(), "\"x\"");
        assert_eq!(Arg::bare("10.0.0.1:80").unwrap().to_string(), "10.0.0.1:80");
        assert!(Arg::bare("a b").is_err());
        assert!(Arg::bare("a\"b").is_err());
        assert!(Arg::bare("it's").is_ok());
        assert!(Arg::bare("").is_err());
    }
}
