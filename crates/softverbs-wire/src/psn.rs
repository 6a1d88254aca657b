//! 24-bit sequence and queue-pair numbers: [`Psn`] and [`Qpn`].
//!
//! Guarantees: both types always hold a value below 2^24 (constructors mask, never fail,
//! never panic); PSN arithmetic wraps modulo 2^24 and compares with the half-window rule of
//! reference §2.1 (IBTA vol. 1 §9.7.1): `a` is after `b` when `a` lies within the 2^23
//! PSNs that follow `b`. PSNs are therefore not totally ordered, and [`Psn`] deliberately
//! implements neither `Ord` nor `PartialOrd`; use [`Psn::diff`], [`Psn::is_before`] and
//! [`Psn::is_after`].

use core::fmt;
use core::ops::{Add, AddAssign};

/// Mask of the 24 significant bits of a PSN, QPN or MSN.
pub(crate) const MASK_24: u32 = 0x00FF_FFFF;

/// A 24-bit packet sequence number with wrap-around arithmetic (reference §2.1).
///
/// ```
/// use softverbs_wire::Psn;
/// let last = Psn::new(0xFF_FFFF);
/// assert_eq!(last.next(), Psn::new(0));
/// assert!(last.is_before(Psn::new(1)));
/// assert_eq!(Psn::new(1).diff(last), 2);
/// ```
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Psn(u32);

impl Psn {
    /// The largest PSN, 2^24 − 1.
    pub const MAX: Psn = Psn(MASK_24);

    /// The PSN with the low 24 bits of `value` (higher bits are discarded).
    #[inline]
    pub const fn new(value: u32) -> Psn {
        Psn(value & MASK_24)
    }

    /// The PSN as a number in `0..2^24`.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24. Same as [`Psn::wrapping_add`]; also available as `psn + n`.
    #[allow(clippy::should_implement_trait)] // `Add<u32>` is implemented too; this inherent
    // method works without importing the trait.
    #[inline]
    pub const fn add(self, n: u32) -> Psn {
        self.wrapping_add(n)
    }

    /// `self + n` modulo 2^24.
    #[inline]
    pub const fn wrapping_add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }

    /// `self − n` modulo 2^24.
    #[inline]
    pub const fn wrapping_sub(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// The PSN that follows this one (wraps from 2^24 − 1 to 0).
    #[inline]
    pub const fn next(self) -> Psn {
        self.wrapping_add(1)
    }

    /// Signed distance `self − other` in 24-bit wrap-around arithmetic, in
    /// `[-2^23, 2^23)` (reference §2.1: `((a − b) << 8) as i32 >> 8`).
    ///
    /// Positive means `self` is after `other`. At exactly 2^23 apart the result is −2^23
    /// in both directions, so each PSN is "before" the other; the half-window rule has no
    /// better answer, and a protocol keeps its windows far smaller (`rxe`: 128 PSNs).
    #[inline]
    pub const fn diff(self, other: Psn) -> i32 {
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// True if `self` comes strictly before `other` (within the 2^23 PSNs before it).
    #[inline]
    pub const fn is_before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// True if `self` comes strictly after `other` (within the 2^23 PSNs after it).
    #[inline]
    pub const fn is_after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }
}

impl Add<u32> for Psn {
    type Output = Psn;

    fn add(self, n: u32) -> Psn {
        self.wrapping_add(n)
    }
}

impl AddAssign<u32> for Psn {
    fn add_assign(&mut self, n: u32) {
        *self = self.wrapping_add(n);
    }
}

impl From<Psn> for u32 {
    fn from(psn: Psn) -> u32 {
        psn.0
    }
}

/// Prints the PSN in decimal, as tshark does (`psn=42`).
impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::LowerHex for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

/// A 24-bit queue-pair number (BTH DestQP, DETH source QP; reference §1.2, §1.3).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Qpn(u32);

impl Qpn {
    /// QP0, the subnet management QP; unused on RoCE (`rxe` drops packets to it).
    pub const SMI: Qpn = Qpn(0);
    /// QP1, the general services QP (CM MADs).
    pub const GSI: Qpn = Qpn(1);
    /// 0xFFFFFF, the multicast destination QPN.
    pub const MULTICAST: Qpn = Qpn(MASK_24);

    /// The QPN with the low 24 bits of `value` (higher bits are discarded).
    #[inline]
    pub const fn new(value: u32) -> Qpn {
        Qpn(value & MASK_24)
    }

    /// The QPN as a number in `0..2^24`.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }
}

impl From<Qpn> for u32 {
    fn from(qpn: Qpn) -> u32 {
        qpn.0
    }
}

/// Prints the QPN as six hex digits, as tshark does (`0x000011`).
impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

impl fmt::LowerHex for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Reference §2.1: PSNs are 24 bits; constructors mask.
    #[test]
    fn psn_new_masks_to_24_bits() {
        assert_eq!(Psn::new(0x1234_5678).value(), 0x34_5678);
        assert_eq!(Psn::new(u32::MAX), Psn::MAX);
        assert_eq!(Qpn::new(0xFF00_0011).value(), 0x11);
    }

    // Reference §2.1 / §6 item 3: arithmetic wraps at 2^24 (0xFFFFFF + 1 = 0).
    #[test]
    fn psn_add_wraps_at_2_pow_24() {
        assert_eq!(Psn::MAX.next(), Psn::new(0));
        assert_eq!(Psn::new(0xFF_FFFE).add(5), Psn::new(3));
        assert_eq!(Psn::new(0xFF_FFFE) + 5, Psn::new(3));
        assert_eq!(Psn::new(3).wrapping_sub(5), Psn::new(0xFF_FFFE));
        assert_eq!(Psn::new(7).wrapping_add(u32::MAX), Psn::new(6));
        let mut p = Psn::MAX;
        p += 2;
        assert_eq!(p, Psn::new(1));
    }

    // Reference §6 item 3: 0xFFFFFF < 0x000001 across the wrap.
    #[test]
    fn psn_comparison_across_wrap() {
        let a = Psn::new(0xFF_FFFF);
        let b = Psn::new(0x00_0001);
        assert!(a.is_before(b));
        assert!(b.is_after(a));
        assert!(!a.is_after(b));
        assert_eq!(b.diff(a), 2);
        assert_eq!(a.diff(b), -2);
        assert_eq!(a.diff(a), 0);
        assert!(!a.is_before(a) && !a.is_after(a));
    }

    // Reference §2.1: half window; diff is in [-2^23, 2^23).
    #[test]
    fn psn_diff_half_window_bounds() {
        let zero = Psn::new(0);
        assert_eq!(Psn::new(0x7F_FFFF).diff(zero), (1 << 23) - 1);
        assert_eq!(Psn::new(0x80_0000).diff(zero), -(1 << 23));
        assert_eq!(zero.diff(Psn::new(0x80_0000)), -(1 << 23));
        assert_eq!(Psn::new(0x80_0001).diff(zero), -(1 << 23) + 1);
        // Responder view (§2.1): the 2^23 PSNs before ePSN are duplicates.
        let epsn = Psn::new(10);
        assert!(Psn::new(10).wrapping_sub(1 << 23).is_before(epsn));
        assert!(Psn::new(10).wrapping_add((1 << 23) - 1).is_after(epsn));
    }

    #[test]
    fn psn_diff_is_antisymmetric_except_at_half_window() {
        for (a, b) in [
            (0u32, 1u32),
            (5, 0xFF_FFF0),
            (0x12_3456, 0x65_4321),
            (0, 0x7F_FFFF),
        ] {
            let (a, b) = (Psn::new(a), Psn::new(b));
            assert_eq!(a.diff(b), -b.diff(a));
            assert_eq!(b.add(a.diff(b) as u32), a);
        }
    }

    #[test]
    fn display_formats_like_tshark() {
        assert_eq!(Psn::new(42).to_string(), "42");
        assert_eq!(format!("{:x}", Psn::new(0x6af7e4)), "6af7e4");
        assert_eq!(Qpn::new(0x11).to_string(), "0x000011");
        assert_eq!(Qpn::MULTICAST.to_string(), "0xffffff");
    }
}
