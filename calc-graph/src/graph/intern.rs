//! Reference-counted string interning for label keys and values, plus a fast hasher for the
//! graph's integer-keyed maps.
//!
//! Labels are stored as sorted `(key, value)` symbol pairs so that 100k endpoints with a dozen
//! labels each cost a few dozen bytes per label, and posting lists are keyed by two `u32`s.
//!
//! Invariant: a symbol is live while its reference count is > 0; [`Interner::release`] on the
//! last reference frees the string and recycles the symbol. Every holder (an item's label set, a
//! profile's labels, a selector's index terms) takes its own reference.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

/// An interned string.
pub(crate) type Sym = u32;

/// FxHash (as in rustc): fast, not DoS resistant; used for every map of the graph (integer ids,
/// the label interner, and the maps keyed by resource keys, policy/endpoint ids and IP set ids,
/// which are validated names or hash-derived ids). SipHash on those string keys was ≈5% of the
/// initial sync.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut buf = [0u8; 8];
            buf[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(buf));
        }
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

pub(crate) type FxBuild = BuildHasherDefault<FxHasher>;
pub(crate) type FxMap<K, V> = HashMap<K, V, FxBuild>;
pub(crate) type FxSet<K> = HashSet<K, FxBuild>;

/// The interner. It hashes with FxHash too: label lookups are on the hot path of every
/// selector evaluation, and label strings are validated (short, restricted alphabet).
#[derive(Default)]
pub(crate) struct Interner {
    map: HashMap<Arc<str>, Sym, FxBuild>,
    slots: Vec<Option<(Arc<str>, u32)>>,
    free: Vec<Sym>,
}

impl Interner {
    /// Interns `s`, taking one reference.
    pub(crate) fn intern(&mut self, s: &str) -> Sym {
        if let Some(&sym) = self.map.get(s) {
            if let Some((_, count)) = &mut self.slots[sym as usize] {
                *count += 1;
            }
            return sym;
        }
        let rc: Arc<str> = Arc::from(s);
        let sym = match self.free.pop() {
            Some(sym) => {
                self.slots[sym as usize] = Some((rc.clone(), 1));
                sym
            }
            None => {
                self.slots.push(Some((rc.clone(), 1)));
                (self.slots.len() - 1) as Sym
            }
        };
        self.map.insert(rc, sym);
        sym
    }

    /// Takes another reference to a live symbol.
    pub(crate) fn retain(&mut self, sym: Sym) {
        if let Some((_, count)) = &mut self.slots[sym as usize] {
            *count += 1;
        }
    }

    /// Drops one reference; the last one frees the string.
    pub(crate) fn release(&mut self, sym: Sym) {
        let slot = &mut self.slots[sym as usize];
        let Some((s, count)) = slot else { return };
        *count -= 1;
        if *count == 0 {
            self.map.remove(&**s);
            *slot = None;
            self.free.push(sym);
        }
    }

    /// The symbol of `s` if some holder has interned it.
    pub(crate) fn lookup(&self, s: &str) -> Option<Sym> {
        self.map.get(s).copied()
    }

    /// The string of a live symbol.
    pub(crate) fn resolve(&self, sym: Sym) -> &str {
        match &self.slots[sym as usize] {
            Some((s, _)) => s,
            None => "",
        }
    }

    /// Number of live strings.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refcounts_free_and_recycle() {
        let mut i = Interner::default();
        let a = i.intern("app");
        let a2 = i.intern("app");
        assert_eq!(a, a2);
        let b = i.intern("web");
        assert_ne!(a, b);
        i.release(a);
        assert_eq!(i.lookup("app"), Some(a));
        i.release(a);
        assert_eq!(i.lookup("app"), None);
        let c = i.intern("db");
        assert_eq!(c, a, "freed symbol is recycled");
        assert_eq!(i.resolve(c), "db");
        assert_eq!(i.resolve(b), "web");
        assert_eq!(i.len(), 2);
    }
}
