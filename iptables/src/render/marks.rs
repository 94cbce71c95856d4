//! Mark-bit allocation (felix-reference §3, v3.30+ layout).
//!
//! Invariant: the five bits are distinct single bits inside the configured mask, allocated lowest
//! first in the order accept, pass, drop, scratch0, scratch1; the endpoint mark is whatever is left.

use super::RenderError;

/// The mark bits the rendered chains use to carry verdicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarkBits {
    /// "A policy or profile allowed it".
    pub accept: u32,
    /// "A policy said Pass (next tier)".
    pub pass: u32,
    /// Set by deny rules just before they DROP.
    pub drop: u32,
    /// OR blocks: "all blocks passed" (AB).
    pub scratch0: u32,
    /// OR blocks: "this block passed" (TB).
    pub scratch1: u32,
    /// The rest of the mask (unused without IPVS; kept for reporting).
    pub endpoint: u32,
}

impl MarkBits {
    /// Allocates the bits from `mask` the way Felix's `NextSingleBitMark` does.
    pub fn allocate(mask: u32) -> Result<Self, RenderError> {
        let mut left = mask;
        let mut next = || {
            if left == 0 {
                return Err(RenderError::MarkMaskTooSmall { mask });
            }
            let bit = left & left.wrapping_neg();
            left &= !bit;
            Ok(bit)
        };
        let accept = next()?;
        let pass = next()?;
        let drop = next()?;
        let scratch0 = next()?;
        let scratch1 = next()?;
        Ok(MarkBits {
            accept,
            pass,
            drop,
            scratch0,
            scratch1,
            endpoint: left,
        })
    }

    /// Felix's `allCalicoMarkBits()`: accept | pass | scratch0 | scratch1 (not drop).
    pub fn all_calico(&self) -> u32 {
        self.accept | self.pass | self.scratch0 | self.scratch1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_mask_gives_felix_v330_layout() {
        let m = MarkBits::allocate(0xffff_0000).unwrap();
        assert_eq!(
            (m.accept, m.pass, m.drop, m.scratch0, m.scratch1),
            (0x10000, 0x20000, 0x40000, 0x80000, 0x100000)
        );
        assert_eq!(m.endpoint, 0xffe0_0000);
        assert_eq!(m.all_calico(), 0x1b0000);
    }

    #[test]
    fn sparse_mask_and_too_small_mask() {
        let m = MarkBits::allocate(0b1010_1010_1010).unwrap();
        assert_eq!((m.accept, m.scratch1), (0b10, 0b10_0000_0000));
        assert_eq!(m.endpoint, 0b1000_0000_0000);
        let err = MarkBits::allocate(0xf).unwrap_err();
        assert_eq!(
            err.to_string(),
            "mark mask 0xf has fewer than 5 bits (need accept, pass, drop, scratch0, scratch1)"
        );
        assert!(MarkBits::allocate(0).is_err());
    }
}
