//! The one error type of the wire layer.
//!
//! Holds [`WireError`], returned by every fallible parse, check and emit in this crate.
//! Guarantees: errors are plain `Copy` values (no allocation, no I/O); a parse that fails
//! leaves nothing half-built behind, so a caller can drop the packet and count the error.

/// Why a buffer could not be parsed, checked or written.
///
/// Parsing never panics: every malformed input ends up as one of these values. The enum is
/// `non_exhaustive` so new checks can be added without breaking callers; match the variants
/// you act on and count the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer ends before a header, the payload pad or the ICRC that must be there.
    #[error("packet truncated")]
    Truncated,
    /// The BTH opcode is not in the supported opcode table (reference §1.5): reserved
    /// values, RD, XRC, CNP (0x81), and the optional FLUSH / ATOMIC_WRITE operations.
    #[error("unknown or unsupported opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// The BTH pad count is larger than the bytes between the headers and the ICRC, is not
    /// zero on an opcode without payload, or does not round payload + pad up to a multiple
    /// of 4 bytes (reference §1.6).
    #[error("pad count does not match the payload")]
    BadPadCount,
    /// The BTH transport header version is not 0 (reference §1.2; `rxe` drops these).
    #[error("transport header version is not 0")]
    BadVersion,
    /// The ICRC trailer does not match the ICRC computed over the packet (reference §1.7).
    #[error("ICRC mismatch: computed {expected:#010x}, trailer holds {found:#010x}")]
    BadIcrc {
        /// The ICRC computed over the received bytes.
        expected: u32,
        /// The ICRC carried by the packet (trailer read least-significant byte first).
        found: u32,
    },
    /// The extension headers present in a [`PacketRepr`](crate::PacketRepr) to be emitted
    /// do not match the set its opcode requires (reference §1.5).
    #[error("extension headers do not match the opcode")]
    HeaderMismatch,
    /// Payload bytes where the opcode carries none (ACK, READ REQUEST, atomics).
    #[error("payload on an opcode that carries none")]
    UnexpectedPayload,
    /// The output buffer is too small for the bytes to be written.
    #[error("buffer too small: {needed} bytes needed, {available} available")]
    BufferTooSmall {
        /// Bytes the write needs.
        needed: usize,
        /// Bytes the buffer has.
        available: usize,
    },
    /// An IP or UDP header (for the ICRC pseudo header) is malformed or not one RoCEv2
    /// uses: not IPv4 without options or IPv6, not UDP, or lengths that do not add up.
    #[error("malformed or unsupported IP/UDP header")]
    BadIpHeader,
    /// A length does not fit its 16-bit IP or UDP header field.
    #[error("length does not fit the IP/UDP length field")]
    LengthOverflow,
}
