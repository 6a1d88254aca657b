//! 24-bit packet sequence number arithmetic used inside the engine.
//!
//! PSNs are compared modulo 2^24 with a half window (reference §2.1): `a` is after `b` when
//! `a` lies within the 2^23 PSNs that follow `b`. The engine keeps PSNs as plain `u32`
//! values masked to 24 bits; these helpers are the only place that does the arithmetic.

/// Mask of the 24 PSN bits.
pub const PSN_MASK: u32 = 0x00FF_FFFF;

/// `psn + n` modulo 2^24.
#[inline]
pub fn add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

/// The signed distance `a - b` in the half window: positive when `a` is after `b`.
#[inline]
pub fn diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_24_bits() {
        assert_eq!(add(PSN_MASK, 1), 0);
        assert_eq!(add(PSN_MASK, 3), 2);
    }

    #[test]
    fn compares_across_the_wrap() {
        // reference §6.3: 0xFFFFFF < 0x000001.
        assert_eq!(diff(1, PSN_MASK), 2);
        assert_eq!(diff(PSN_MASK, 1), -2);
        assert_eq!(diff(5, 5), 0);
        assert_eq!(diff(0x80_0000, 0), -0x80_0000);
        assert_eq!(diff(0x7F_FFFF, 0), 0x7F_FFFF);
    }
}
