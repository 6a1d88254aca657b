//! Big-endian field readers and writers shared by the header modules.
//!
//! Guarantees: each function indexes exactly the given range and panics only if that range
//! lies outside the slice, which the callers rule out by checking the header length first
//! (every header module states this in its no-panic contract).

use core::ops::Range;

#[inline]
pub(crate) fn read_u16(data: &[u8], range: Range<usize>) -> u16 {
    let mut bytes = [0u8; 2];
    bytes.copy_from_slice(&data[range]);
    u16::from_be_bytes(bytes)
}

#[inline]
pub(crate) fn read_u24(data: &[u8], range: Range<usize>) -> u32 {
    let mut bytes = [0u8; 4];
    bytes[1..].copy_from_slice(&data[range]);
    u32::from_be_bytes(bytes)
}

#[inline]
pub(crate) fn read_u32(data: &[u8], range: Range<usize>) -> u32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&data[range]);
    u32::from_be_bytes(bytes)
}

#[inline]
pub(crate) fn read_u64(data: &[u8], range: Range<usize>) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&data[range]);
    u64::from_be_bytes(bytes)
}

#[inline]
pub(crate) fn write_u16(data: &mut [u8], range: Range<usize>, value: u16) {
    data[range].copy_from_slice(&value.to_be_bytes());
}

/// Writes the low 24 bits of `value`.
#[inline]
pub(crate) fn write_u24(data: &mut [u8], range: Range<usize>, value: u32) {
    data[range].copy_from_slice(&value.to_be_bytes()[1..]);
}

#[inline]
pub(crate) fn write_u32(data: &mut [u8], range: Range<usize>, value: u32) {
    data[range].copy_from_slice(&value.to_be_bytes());
}

#[inline]
pub(crate) fn write_u64(data: &mut [u8], range: Range<usize>, value: u64) {
    data[range].copy_from_slice(&value.to_be_bytes());
}

/// Generates the checked-view boilerplate of a header module: the `Header<T>` struct,
/// `new_unchecked`, `new_checked`, `check_len`, `into_inner`, and `Display` through the
/// module's repr. Expects a `HEADER_LEN` constant in the invoking module.
macro_rules! header_view {
    ($name:literal, $repr:ident) => {
        #[doc = concat!("A read/write view of a ", $name, " at the start of a buffer.")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct Header<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Header<T> {
            /// Wraps a buffer without checking its length. Getters and setters panic if the
            /// buffer is shorter than [`HEADER_LEN`]; use [`Header::new_checked`] for
            /// untrusted input.
            pub const fn new_unchecked(buffer: T) -> Header<T> {
                Header { buffer }
            }

            #[doc = concat!("Wraps a buffer after checking it holds a whole ", $name, ".")]
            pub fn new_checked(buffer: T) -> Result<Header<T>, $crate::WireError> {
                let header = Header::new_unchecked(buffer);
                header.check_len()?;
                Ok(header)
            }

            /// `Err(Truncated)` if the buffer is shorter than [`HEADER_LEN`].
            pub fn check_len(&self) -> Result<(), $crate::WireError> {
                if self.buffer.as_ref().len() < HEADER_LEN {
                    Err($crate::WireError::Truncated)
                } else {
                    Ok(())
                }
            }

            /// Gives the buffer back.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }

        /// Prints the parsed header, or the reason it does not parse.
        impl<T: AsRef<[u8]>> core::fmt::Display for Header<T> {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                match $repr::parse(self) {
                    Ok(repr) => core::fmt::Display::fmt(&repr, f),
                    Err(err) => write!(f, concat!($name, " ({})"), err),
                }
            }
        }
    };
}

pub(crate) use header_view;
