//! BTH opcodes and the opcode table: which headers and payload each opcode carries.
//!
//! Holds [`Opcode`] (a newtype over the BTH opcode byte, with a named constant for every RC,
//! UC and UD opcode of reference §1.5 / IBTA vol. 1 §9.2 table 35), [`Opcode::info`] (the
//! table lookup) and the classification types [`OpcodeInfo`], [`Transport`], [`OpKind`],
//! [`Position`].
//!
//! Guarantees: every `u8` is a valid [`Opcode`] value; [`Opcode::info`] is a total, const
//! function that returns `None` for every opcode this device does not implement (reserved
//! values, RD, XRC, CNP 0x81), so a peer's unknown opcode can be dropped and counted, never
//! trusted. The IBTA 1.5 opcodes RC FLUSH (0x1C: FETH, RETH, no payload) and RC ATOMIC
//! WRITE (0x1D: RETH, 8 bytes of payload) are in the table, laid out as Linux's rxe sends
//! them. Nothing here panics.

use core::fmt;

/// Transport service class, the top three bits of the opcode (reference §1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable connected (opcode base 0x00).
    Rc,
    /// Unreliable connected (opcode base 0x20).
    Uc,
    /// Unreliable datagram (opcode base 0x60).
    Ud,
}

impl Transport {
    /// The opcode base of this transport (bits 7..5 of the opcode).
    pub const fn opcode_base(self) -> u8 {
        match self {
            Transport::Rc => 0x00,
            Transport::Uc => 0x20,
            Transport::Ud => 0x60,
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Ud => "UD",
        })
    }
}

/// The operation an opcode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// SEND (all variants: plain, with immediate, with invalidate).
    Send,
    /// RDMA WRITE (plain or with immediate).
    RdmaWrite,
    /// RDMA READ request.
    RdmaReadRequest,
    /// RDMA READ response (a response, handled by the requester's completer).
    RdmaReadResponse,
    /// ACKNOWLEDGE: ACK, NAK or RNR NAK, told apart by the AETH syndrome.
    Acknowledge,
    /// ATOMIC ACKNOWLEDGE, carrying the original remote value.
    AtomicAcknowledge,
    /// ATOMIC COMPARE AND SWAP request.
    CompareSwap,
    /// ATOMIC FETCH AND ADD request.
    FetchAdd,
    /// FLUSH request (IBTA 1.5): answered, like ATOMIC WRITE, by a zero-length RDMA READ
    /// RESPONSE ONLY once the data is placed.
    Flush,
    /// ATOMIC WRITE request (IBTA 1.5): 8 bytes written at once at the RETH's address.
    AtomicWrite,
}

/// Where a packet sits in its message (the S / M / E flags of reference §1.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message (S).
    First,
    /// Middle packet (M).
    Middle,
    /// Last packet of a multi-packet message (E).
    Last,
    /// The only packet of its message (S+E); also every ACK, READ request and atomic.
    Only,
}

impl Position {
    /// True for [`Position::First`] and [`Position::Only`]: the packet starts a message.
    #[inline]
    pub const fn is_first(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }

    /// True for [`Position::Last`] and [`Position::Only`]: the packet ends a message.
    #[inline]
    pub const fn is_last(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// What the opcode table (reference §1.5) says about one opcode.
///
/// The extension headers follow the BTH in this fixed order, whichever are present:
/// DETH, FETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH (IBTA vol. 1 §9.2; the
/// FETH precedes the RETH in FLUSH, IBTA 1.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpcodeInfo {
    /// Transport service of the opcode.
    pub transport: Transport,
    /// Operation of the opcode.
    pub kind: OpKind,
    /// Position of the packet in its message.
    pub position: Position,
    /// A RETH (16 bytes) follows the BTH.
    pub has_reth: bool,
    /// An AETH (4 bytes) follows the BTH.
    pub has_aeth: bool,
    /// A DETH (8 bytes) follows the BTH.
    pub has_deth: bool,
    /// An ImmDt (4 bytes) follows the other extension headers.
    pub has_immdt: bool,
    /// An IETH (4 bytes) follows the BTH.
    pub has_ieth: bool,
    /// An AtomicETH (28 bytes) follows the BTH.
    pub has_atomic_eth: bool,
    /// An AtomicAckETH (8 bytes) follows the AETH.
    pub has_atomic_ack_eth: bool,
    /// A FETH (4 bytes) follows the BTH, before the RETH (FLUSH only).
    pub has_feth: bool,
    /// The packet may carry payload (column P of the table). Without it, the bytes between
    /// the headers and the ICRC must be empty and the pad count zero.
    pub has_payload: bool,
}

impl OpcodeInfo {
    /// Bytes of extension headers after the BTH.
    #[inline]
    pub const fn ext_header_len(&self) -> usize {
        (if self.has_deth {
            crate::deth::HEADER_LEN
        } else {
            0
        }) + (if self.has_feth {
            crate::feth::HEADER_LEN
        } else {
            0
        }) + (if self.has_reth {
            crate::reth::HEADER_LEN
        } else {
            0
        }) + (if self.has_atomic_eth {
            crate::atomic_eth::HEADER_LEN
        } else {
            0
        }) + (if self.has_aeth {
            crate::aeth::HEADER_LEN
        } else {
            0
        }) + (if self.has_atomic_ack_eth {
            crate::atomic_ack_eth::HEADER_LEN
        } else {
            0
        }) + (if self.has_immdt {
            crate::immdt::HEADER_LEN
        } else {
            0
        }) + (if self.has_ieth {
            crate::ieth::HEADER_LEN
        } else {
            0
        })
    }

    /// Bytes of all transport headers: BTH plus extension headers.
    #[inline]
    pub const fn header_len(&self) -> usize {
        crate::bth::HEADER_LEN + self.ext_header_len()
    }

    /// True for responses, which go to the requester's completer: READ responses, ACK and
    /// ATOMIC ACK (RC 0x0D–0x12, reference §1.5 notes).
    #[inline]
    pub const fn is_response(&self) -> bool {
        matches!(
            self.kind,
            OpKind::RdmaReadResponse | OpKind::Acknowledge | OpKind::AtomicAcknowledge
        )
    }

    /// True for requests, which go to the responder (everything but responses).
    #[inline]
    pub const fn is_request(&self) -> bool {
        !self.is_response()
    }

    /// Column RWR of reference §1.5: this packet consumes a receive WQE at the responder.
    /// SEND consumes it at the first packet; RDMA WRITE with immediate at the last one.
    #[inline]
    pub const fn consumes_recv_wqe(&self) -> bool {
        match self.kind {
            OpKind::Send => self.position.is_first(),
            OpKind::RdmaWrite => self.has_immdt,
            _ => false,
        }
    }

    /// Column C of reference §1.5: this packet produces a receive completion when its
    /// message ends (SEND LAST/ONLY of every variant, RDMA WRITE with immediate).
    #[inline]
    pub const fn completes_recv(&self) -> bool {
        match self.kind {
            OpKind::Send => self.position.is_last(),
            OpKind::RdmaWrite => self.has_immdt,
            _ => false,
        }
    }
}

/// A BTH opcode byte. Every `u8` is representable; [`Opcode::info`] says whether it is one
/// this device implements.
///
/// Named constants cover every opcode of reference §1.5. `Display` prints the IBTA name
/// (`RC SEND ONLY`, `UD SEND ONLY WITH IMMEDIATE`), or `UNKNOWN(0x15)`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Opcode(pub u8);

// Header-set bits for the private table below.
const RETH: u8 = 1 << 0;
const AETH: u8 = 1 << 1;
const DETH: u8 = 1 << 2;
const IMMDT: u8 = 1 << 3;
const IETH: u8 = 1 << 4;
const ATOMIC: u8 = 1 << 5;
const ATOMIC_ACK: u8 = 1 << 6;
const FETH: u8 = 1 << 7;

const fn entry(
    transport: Transport,
    kind: OpKind,
    position: Position,
    has_payload: bool,
    headers: u8,
) -> Option<OpcodeInfo> {
    Some(OpcodeInfo {
        transport,
        kind,
        position,
        has_reth: headers & RETH != 0,
        has_aeth: headers & AETH != 0,
        has_deth: headers & DETH != 0,
        has_immdt: headers & IMMDT != 0,
        has_ieth: headers & IETH != 0,
        has_atomic_eth: headers & ATOMIC != 0,
        has_atomic_ack_eth: headers & ATOMIC_ACK != 0,
        has_feth: headers & FETH != 0,
        has_payload,
    })
}

/// [`Opcode::info`] of every opcode byte: each packet parsed and built looks its opcode up
/// with one load.
const INFO: [Option<OpcodeInfo>; 256] = {
    let mut table = [None; 256];
    let mut opcode = 0;
    while opcode < 256 {
        table[opcode] = Opcode(opcode as u8).lookup();
        opcode += 1;
    }
    table
};

/// The SEND and RDMA WRITE families shared by RC and UC (operation codes 0x00–0x0B).
const fn send_write_family(transport: Transport, operation: u8) -> Option<OpcodeInfo> {
    use OpKind::{RdmaWrite, Send};
    use Position::{First, Last, Middle, Only};
    match operation {
        0x00 => entry(transport, Send, First, true, 0),
        0x01 => entry(transport, Send, Middle, true, 0),
        0x02 => entry(transport, Send, Last, true, 0),
        0x03 => entry(transport, Send, Last, true, IMMDT),
        0x04 => entry(transport, Send, Only, true, 0),
        0x05 => entry(transport, Send, Only, true, IMMDT),
        0x06 => entry(transport, RdmaWrite, First, true, RETH),
        0x07 => entry(transport, RdmaWrite, Middle, true, 0),
        0x08 => entry(transport, RdmaWrite, Last, true, 0),
        0x09 => entry(transport, RdmaWrite, Last, true, IMMDT),
        0x0A => entry(transport, RdmaWrite, Only, true, RETH),
        0x0B => entry(transport, RdmaWrite, Only, true, RETH | IMMDT),
        _ => None,
    }
}

impl Opcode {
    /// RC SEND FIRST (0x00).
    pub const RC_SEND_FIRST: Opcode = Opcode(0x00);
    /// RC SEND MIDDLE (0x01).
    pub const RC_SEND_MIDDLE: Opcode = Opcode(0x01);
    /// RC SEND LAST (0x02).
    pub const RC_SEND_LAST: Opcode = Opcode(0x02);
    /// RC SEND LAST WITH IMMEDIATE (0x03).
    pub const RC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x03);
    /// RC SEND ONLY (0x04).
    pub const RC_SEND_ONLY: Opcode = Opcode(0x04);
    /// RC SEND ONLY WITH IMMEDIATE (0x05).
    pub const RC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x05);
    /// RC RDMA WRITE FIRST (0x06).
    pub const RC_RDMA_WRITE_FIRST: Opcode = Opcode(0x06);
    /// RC RDMA WRITE MIDDLE (0x07).
    pub const RC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x07);
    /// RC RDMA WRITE LAST (0x08).
    pub const RC_RDMA_WRITE_LAST: Opcode = Opcode(0x08);
    /// RC RDMA WRITE LAST WITH IMMEDIATE (0x09).
    pub const RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x09);
    /// RC RDMA WRITE ONLY (0x0A).
    pub const RC_RDMA_WRITE_ONLY: Opcode = Opcode(0x0A);
    /// RC RDMA WRITE ONLY WITH IMMEDIATE (0x0B).
    pub const RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x0B);
    /// RC RDMA READ REQUEST (0x0C).
    pub const RC_RDMA_READ_REQUEST: Opcode = Opcode(0x0C);
    /// RC RDMA READ RESPONSE FIRST (0x0D).
    pub const RC_RDMA_READ_RESPONSE_FIRST: Opcode = Opcode(0x0D);
    /// RC RDMA READ RESPONSE MIDDLE (0x0E).
    pub const RC_RDMA_READ_RESPONSE_MIDDLE: Opcode = Opcode(0x0E);
    /// RC RDMA READ RESPONSE LAST (0x0F).
    pub const RC_RDMA_READ_RESPONSE_LAST: Opcode = Opcode(0x0F);
    /// RC RDMA READ RESPONSE ONLY (0x10).
    pub const RC_RDMA_READ_RESPONSE_ONLY: Opcode = Opcode(0x10);
    /// RC ACKNOWLEDGE (0x11).
    pub const RC_ACKNOWLEDGE: Opcode = Opcode(0x11);
    /// RC ATOMIC ACKNOWLEDGE (0x12).
    pub const RC_ATOMIC_ACKNOWLEDGE: Opcode = Opcode(0x12);
    /// RC COMPARE SWAP (0x13).
    pub const RC_COMPARE_SWAP: Opcode = Opcode(0x13);
    /// RC FETCH ADD (0x14).
    pub const RC_FETCH_ADD: Opcode = Opcode(0x14);
    /// RC SEND LAST WITH INVALIDATE (0x16).
    pub const RC_SEND_LAST_WITH_INVALIDATE: Opcode = Opcode(0x16);
    /// RC SEND ONLY WITH INVALIDATE (0x17).
    pub const RC_SEND_ONLY_WITH_INVALIDATE: Opcode = Opcode(0x17);
    /// RC FLUSH (0x1C, IBTA 1.5): FETH, RETH, no payload.
    pub const RC_FLUSH: Opcode = Opcode(0x1C);
    /// RC ATOMIC WRITE (0x1D, IBTA 1.5): RETH and 8 bytes of payload.
    pub const RC_ATOMIC_WRITE: Opcode = Opcode(0x1D);

    /// UC SEND FIRST (0x20).
    pub const UC_SEND_FIRST: Opcode = Opcode(0x20);
    /// UC SEND MIDDLE (0x21).
    pub const UC_SEND_MIDDLE: Opcode = Opcode(0x21);
    /// UC SEND LAST (0x22).
    pub const UC_SEND_LAST: Opcode = Opcode(0x22);
    /// UC SEND LAST WITH IMMEDIATE (0x23).
    pub const UC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x23);
    /// UC SEND ONLY (0x24).
    pub const UC_SEND_ONLY: Opcode = Opcode(0x24);
    /// UC SEND ONLY WITH IMMEDIATE (0x25).
    pub const UC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x25);
    /// UC RDMA WRITE FIRST (0x26).
    pub const UC_RDMA_WRITE_FIRST: Opcode = Opcode(0x26);
    /// UC RDMA WRITE MIDDLE (0x27).
    pub const UC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x27);
    /// UC RDMA WRITE LAST (0x28).
    pub const UC_RDMA_WRITE_LAST: Opcode = Opcode(0x28);
    /// UC RDMA WRITE LAST WITH IMMEDIATE (0x29).
    pub const UC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x29);
    /// UC RDMA WRITE ONLY (0x2A).
    pub const UC_RDMA_WRITE_ONLY: Opcode = Opcode(0x2A);
    /// UC RDMA WRITE ONLY WITH IMMEDIATE (0x2B).
    pub const UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x2B);

    /// UD SEND ONLY (0x64).
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    /// UD SEND ONLY WITH IMMEDIATE (0x65).
    pub const UD_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x65);

    /// Congestion notification packet (0x81). Named only: [`Opcode::info`] is `None`, so
    /// CNPs are dropped and counted, as `rxe` does (reference §1.5, §4.6).
    pub const CNP: Opcode = Opcode(0x81);

    /// The opcode with this byte value.
    #[inline]
    pub const fn new(value: u8) -> Opcode {
        Opcode(value)
    }

    /// The opcode byte.
    #[inline]
    pub const fn value(self) -> u8 {
        self.0
    }

    /// The opcode table entry (reference §1.5), or `None` for an opcode this device does
    /// not implement: reserved values, RD, XRC, CNP.
    #[inline]
    pub const fn info(self) -> Option<OpcodeInfo> {
        INFO[self.0 as usize]
    }

    /// The table entry of [`Opcode::info`], worked out (once, at compile time, into
    /// [`INFO`]).
    const fn lookup(self) -> Option<OpcodeInfo> {
        use OpKind::*;
        use Position::*;
        use Transport::{Rc, Uc, Ud};
        match self.0 {
            0x00..=0x0B => send_write_family(Rc, self.0),
            0x0C => entry(Rc, RdmaReadRequest, Only, false, RETH),
            0x0D => entry(Rc, RdmaReadResponse, First, true, AETH),
            0x0E => entry(Rc, RdmaReadResponse, Middle, true, 0),
            0x0F => entry(Rc, RdmaReadResponse, Last, true, AETH),
            0x10 => entry(Rc, RdmaReadResponse, Only, true, AETH),
            0x11 => entry(Rc, Acknowledge, Only, false, AETH),
            0x12 => entry(Rc, AtomicAcknowledge, Only, false, AETH | ATOMIC_ACK),
            0x13 => entry(Rc, CompareSwap, Only, false, ATOMIC),
            0x14 => entry(Rc, FetchAdd, Only, false, ATOMIC),
            0x16 => entry(Rc, Send, Last, true, IETH),
            0x17 => entry(Rc, Send, Only, true, IETH),
            0x1C => entry(Rc, Flush, Only, false, FETH | RETH),
            0x1D => entry(Rc, AtomicWrite, Only, true, RETH),
            0x20..=0x2B => send_write_family(Uc, self.0 - 0x20),
            0x64 => entry(Ud, Send, Only, true, DETH),
            0x65 => entry(Ud, Send, Only, true, DETH | IMMDT),
            _ => None,
        }
    }

    /// True if [`Opcode::info`] knows this opcode.
    pub const fn is_supported(self) -> bool {
        self.info().is_some()
    }

    /// The SEND opcode for a transport, position and variant, or `None` if that combination
    /// does not exist: immediate and invalidate together; either one on a FIRST or MIDDLE
    /// packet; invalidate outside RC; a UD packet other than ONLY.
    pub const fn send(
        transport: Transport,
        position: Position,
        immediate: bool,
        invalidate: bool,
    ) -> Option<Opcode> {
        let operation = match (position, immediate, invalidate) {
            (Position::First, false, false) => 0x00,
            (Position::Middle, false, false) => 0x01,
            (Position::Last, false, false) => 0x02,
            (Position::Last, true, false) => 0x03,
            (Position::Only, false, false) => 0x04,
            (Position::Only, true, false) => 0x05,
            (Position::Last, false, true) => 0x16,
            (Position::Only, false, true) => 0x17,
            _ => return None,
        };
        match transport {
            Transport::Rc => Some(Opcode(operation)),
            Transport::Uc if !invalidate => Some(Opcode(0x20 + operation)),
            Transport::Ud => match operation {
                0x04 => Some(Opcode::UD_SEND_ONLY),
                0x05 => Some(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE),
                _ => None,
            },
            Transport::Uc => None,
        }
    }

    /// The RDMA WRITE opcode for a transport and position, or `None` if that combination
    /// does not exist: UD, or immediate on a FIRST or MIDDLE packet.
    pub const fn write(
        transport: Transport,
        position: Position,
        immediate: bool,
    ) -> Option<Opcode> {
        let operation = match (position, immediate) {
            (Position::First, false) => 0x06,
            (Position::Middle, false) => 0x07,
            (Position::Last, false) => 0x08,
            (Position::Last, true) => 0x09,
            (Position::Only, false) => 0x0A,
            (Position::Only, true) => 0x0B,
            _ => return None,
        };
        match transport {
            Transport::Rc => Some(Opcode(operation)),
            Transport::Uc => Some(Opcode(0x20 + operation)),
            Transport::Ud => None,
        }
    }

    /// The RC RDMA READ RESPONSE opcode for a position.
    pub const fn read_response(position: Position) -> Opcode {
        match position {
            Position::First => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
            Position::Middle => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            Position::Last => Opcode::RC_RDMA_READ_RESPONSE_LAST,
            Position::Only => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        }
    }

    /// The IBTA name, upper case with spaces (`RC RDMA READ RESPONSE FIRST`), or `None` for
    /// an opcode without a constant here.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0x00 => "RC SEND FIRST",
            0x01 => "RC SEND MIDDLE",
            0x02 => "RC SEND LAST",
            0x03 => "RC SEND LAST WITH IMMEDIATE",
            0x04 => "RC SEND ONLY",
            0x05 => "RC SEND ONLY WITH IMMEDIATE",
            0x06 => "RC RDMA WRITE FIRST",
            0x07 => "RC RDMA WRITE MIDDLE",
            0x08 => "RC RDMA WRITE LAST",
            0x09 => "RC RDMA WRITE LAST WITH IMMEDIATE",
            0x0A => "RC RDMA WRITE ONLY",
            0x0B => "RC RDMA WRITE ONLY WITH IMMEDIATE",
            0x0C => "RC RDMA READ REQUEST",
            0x0D => "RC RDMA READ RESPONSE FIRST",
            0x0E => "RC RDMA READ RESPONSE MIDDLE",
            0x0F => "RC RDMA READ RESPONSE LAST",
            0x10 => "RC RDMA READ RESPONSE ONLY",
            0x11 => "RC ACKNOWLEDGE",
            0x12 => "RC ATOMIC ACKNOWLEDGE",
            0x13 => "RC COMPARE SWAP",
            0x14 => "RC FETCH ADD",
            0x16 => "RC SEND LAST WITH INVALIDATE",
            0x17 => "RC SEND ONLY WITH INVALIDATE",
            0x1C => "RC FLUSH",
            0x1D => "RC ATOMIC WRITE",
            0x20 => "UC SEND FIRST",
            0x21 => "UC SEND MIDDLE",
            0x22 => "UC SEND LAST",
            0x23 => "UC SEND LAST WITH IMMEDIATE",
            0x24 => "UC SEND ONLY",
            0x25 => "UC SEND ONLY WITH IMMEDIATE",
            0x26 => "UC RDMA WRITE FIRST",
            0x27 => "UC RDMA WRITE MIDDLE",
            0x28 => "UC RDMA WRITE LAST",
            0x29 => "UC RDMA WRITE LAST WITH IMMEDIATE",
            0x2A => "UC RDMA WRITE ONLY",
            0x2B => "UC RDMA WRITE ONLY WITH IMMEDIATE",
            0x64 => "UD SEND ONLY",
            0x65 => "UD SEND ONLY WITH IMMEDIATE",
            0x81 => "CNP",
            _ => return None,
        })
    }
}

impl From<u8> for Opcode {
    fn from(value: u8) -> Opcode {
        Opcode(value)
    }
}

impl From<Opcode> for u8 {
    fn from(opcode: Opcode) -> u8 {
        opcode.0
    }
}

/// Prints the IBTA name (`RC SEND ONLY`), or `UNKNOWN(0x15)`.
impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "UNKNOWN({:#04x})", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference §1.5, transcribed: opcode, headers after the BTH in order, P (payload),
    /// S/M/E, RWR, C. UC 0x20–0x2B repeat RC 0x00–0x0B.
    const TABLE: &[(u8, &str, bool, &str, bool, bool)] = &[
        (0x00, "", true, "S", true, false),
        (0x01, "", true, "M", false, false),
        (0x02, "", true, "E", false, true),
        (0x03, "ImmDt", true, "E", false, true),
        (0x04, "", true, "S+E", true, true),
        (0x05, "ImmDt", true, "S+E", true, true),
        (0x06, "RETH", true, "S", false, false),
        (0x07, "", true, "M", false, false),
        (0x08, "", true, "E", false, false),
        (0x09, "ImmDt", true, "E", true, true),
        (0x0A, "RETH", true, "S+E", false, false),
        (0x0B, "RETH ImmDt", true, "S+E", true, true),
        (0x0C, "RETH", false, "S+E", false, false),
        (0x0D, "AETH", true, "S", false, false),
        (0x0E, "", true, "M", false, false),
        (0x0F, "AETH", true, "E", false, false),
        (0x10, "AETH", true, "S+E", false, false),
        (0x11, "AETH", false, "S+E", false, false),
        (0x12, "AETH AtomicAckETH", false, "S+E", false, false),
        (0x13, "AtomicETH", false, "S+E", false, false),
        (0x14, "AtomicETH", false, "S+E", false, false),
        (0x16, "IETH", true, "E", false, true),
        (0x17, "IETH", true, "S+E", true, true),
        (0x1C, "FETH RETH", false, "S+E", false, false),
        (0x1D, "RETH", true, "S+E", false, false),
        (0x64, "DETH", true, "S+E", true, true),
        (0x65, "DETH ImmDt", true, "S+E", true, true),
    ];

    fn reference_rows() -> Vec<(u8, &'static str, bool, &'static str, bool, bool)> {
        let uc = TABLE
            .iter()
            .filter(|row| row.0 <= 0x0B)
            .map(|&(op, headers, payload, sme, rwr, c)| (op + 0x20, headers, payload, sme, rwr, c));
        TABLE.iter().copied().chain(uc).collect()
    }

    fn headers_of(info: &OpcodeInfo) -> String {
        // In wire order (IBTA vol. 1 §9.2).
        let mut names = Vec::new();
        for (present, name) in [
            (info.has_deth, "DETH"),
            (info.has_feth, "FETH"),
            (info.has_reth, "RETH"),
            (info.has_atomic_eth, "AtomicETH"),
            (info.has_aeth, "AETH"),
            (info.has_atomic_ack_eth, "AtomicAckETH"),
            (info.has_immdt, "ImmDt"),
            (info.has_ieth, "IETH"),
        ] {
            if present {
                names.push(name);
            }
        }
        names.join(" ")
    }

    // Reference §1.5: every supported opcode's header set, payload flag, S/M/E position,
    // RWR and C columns.
    #[test]
    fn every_opcode_matches_reference_table() {
        let rows = reference_rows();
        assert_eq!(rows.len(), 39);
        for (op, headers, payload, sme, rwr, c) in rows {
            let info = Opcode(op)
                .info()
                .unwrap_or_else(|| panic!("{op:#04x} missing"));
            assert_eq!(headers_of(&info), headers, "{op:#04x} headers");
            assert_eq!(info.has_payload, payload, "{op:#04x} payload");
            let position = match sme {
                "S" => Position::First,
                "M" => Position::Middle,
                "E" => Position::Last,
                _ => Position::Only,
            };
            assert_eq!(info.position, position, "{op:#04x} position");
            assert_eq!(info.consumes_recv_wqe(), rwr, "{op:#04x} RWR");
            assert_eq!(info.completes_recv(), c, "{op:#04x} C");
            let transport = match op >> 5 {
                0 => Transport::Rc,
                1 => Transport::Uc,
                _ => Transport::Ud,
            };
            assert_eq!(info.transport, transport, "{op:#04x} transport");
        }
    }

    // Reference §1.5: reserved values, RD, XRC and CNP are not supported; exactly the 39
    // table rows are (IBTA 1.5's FLUSH and ATOMIC WRITE included, RC only).
    #[test]
    fn only_table_opcodes_are_supported() {
        let supported: Vec<u8> = reference_rows().iter().map(|row| row.0).collect();
        for op in 0..=u8::MAX {
            assert_eq!(
                Opcode(op).is_supported(),
                supported.contains(&op),
                "{op:#04x}"
            );
        }
        for op in [
            0x15, 0x18, 0x3C, 0x3D, 0x2C, 0x40, 0x4A, 0x66, 0x81, 0xA0, 0xFF,
        ] {
            assert_eq!(Opcode(op).info(), None);
        }
    }

    // Reference §1.5: requests vs responses (RC 0x0D–0x12 are responses).
    #[test]
    fn responses_are_rc_0x0d_to_0x12() {
        for op in reference_rows().iter().map(|row| row.0) {
            let info = Opcode(op).info().unwrap();
            assert_eq!(info.is_response(), (0x0D..=0x12).contains(&op), "{op:#04x}");
            assert_eq!(info.is_request(), !info.is_response());
        }
    }

    // Reference §1.1, §1.3: header lengths (BTH 12, RETH 16, AETH 4, DETH 8, ImmDt 4,
    // IETH 4, AtomicETH 28, AtomicAckETH 8).
    #[test]
    fn header_len_sums_extension_headers() {
        assert_eq!(Opcode::RC_SEND_MIDDLE.info().unwrap().header_len(), 12);
        assert_eq!(
            Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
                .info()
                .unwrap()
                .header_len(),
            32
        );
        assert_eq!(
            Opcode::RC_ATOMIC_ACKNOWLEDGE.info().unwrap().header_len(),
            24
        );
        assert_eq!(Opcode::RC_COMPARE_SWAP.info().unwrap().header_len(), 40);
        assert_eq!(
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
                .info()
                .unwrap()
                .header_len(),
            24
        );
        assert_eq!(
            Opcode::RC_SEND_ONLY_WITH_INVALIDATE
                .info()
                .unwrap()
                .ext_header_len(),
            4
        );
        assert_eq!(Opcode::RC_ACKNOWLEDGE.info().unwrap().header_len(), 16);
        // IBTA 1.5 / rxe_opcode.c: FLUSH is BTH + FETH + RETH (32 bytes), ATOMIC WRITE
        // BTH + RETH (28 bytes) before its 8 bytes of payload.
        assert_eq!(Opcode::RC_FLUSH.info().unwrap().header_len(), 32);
        assert_eq!(Opcode::RC_ATOMIC_WRITE.info().unwrap().header_len(), 28);
    }

    #[test]
    fn send_helper_builds_every_send_opcode() {
        use Position::*;
        use Transport::*;
        let cases = [
            (Rc, First, false, false, Some(Opcode::RC_SEND_FIRST)),
            (Rc, Middle, false, false, Some(Opcode::RC_SEND_MIDDLE)),
            (Rc, Last, false, false, Some(Opcode::RC_SEND_LAST)),
            (
                Rc,
                Last,
                true,
                false,
                Some(Opcode::RC_SEND_LAST_WITH_IMMEDIATE),
            ),
            (
                Rc,
                Last,
                false,
                true,
                Some(Opcode::RC_SEND_LAST_WITH_INVALIDATE),
            ),
            (Rc, Only, false, false, Some(Opcode::RC_SEND_ONLY)),
            (
                Rc,
                Only,
                true,
                false,
                Some(Opcode::RC_SEND_ONLY_WITH_IMMEDIATE),
            ),
            (
                Rc,
                Only,
                false,
                true,
                Some(Opcode::RC_SEND_ONLY_WITH_INVALIDATE),
            ),
            (Uc, First, false, false, Some(Opcode::UC_SEND_FIRST)),
            (Uc, Middle, false, false, Some(Opcode::UC_SEND_MIDDLE)),
            (
                Uc,
                Last,
                true,
                false,
                Some(Opcode::UC_SEND_LAST_WITH_IMMEDIATE),
            ),
            (Uc, Only, false, false, Some(Opcode::UC_SEND_ONLY)),
            (
                Uc,
                Only,
                true,
                false,
                Some(Opcode::UC_SEND_ONLY_WITH_IMMEDIATE),
            ),
            (Ud, Only, false, false, Some(Opcode::UD_SEND_ONLY)),
            (
                Ud,
                Only,
                true,
                false,
                Some(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE),
            ),
            (Rc, First, true, false, None),
            (Rc, Middle, false, true, None),
            (Rc, Only, true, true, None),
            (Uc, Only, false, true, None),
            (Ud, First, false, false, None),
            (Ud, Only, false, true, None),
        ];
        for (transport, position, imm, inv, expected) in cases {
            assert_eq!(Opcode::send(transport, position, imm, inv), expected);
            if let Some(opcode) = expected {
                let info = opcode.info().unwrap();
                assert_eq!(
                    (info.transport, info.kind, info.position),
                    (transport, OpKind::Send, position)
                );
                assert_eq!((info.has_immdt, info.has_ieth), (imm, inv));
            }
        }
    }

    #[test]
    fn write_and_read_response_helpers() {
        use Position::*;
        use Transport::*;
        for transport in [Rc, Uc] {
            for position in [First, Middle, Last, Only] {
                for imm in [false, true] {
                    let opcode = Opcode::write(transport, position, imm);
                    if imm && !position.is_last() {
                        assert_eq!(opcode, None);
                        continue;
                    }
                    let info = opcode.unwrap().info().unwrap();
                    assert_eq!(info.kind, OpKind::RdmaWrite);
                    assert_eq!(
                        (info.transport, info.position, info.has_immdt),
                        (transport, position, imm)
                    );
                    assert_eq!(info.has_reth, position.is_first());
                }
            }
        }
        assert_eq!(Opcode::write(Ud, Only, false), None);
        assert_eq!(
            Opcode::write(Rc, Only, true),
            Some(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE)
        );
        for position in [First, Middle, Last, Only] {
            let info = Opcode::read_response(position).info().unwrap();
            assert_eq!(
                (info.kind, info.position),
                (OpKind::RdmaReadResponse, position)
            );
            assert_eq!(info.has_aeth, position != Middle);
        }
    }

    #[test]
    fn display_uses_ibta_names() {
        assert_eq!(Opcode::RC_SEND_ONLY.to_string(), "RC SEND ONLY");
        assert_eq!(
            Opcode::RC_RDMA_READ_RESPONSE_FIRST.to_string(),
            "RC RDMA READ RESPONSE FIRST"
        );
        assert_eq!(
            Opcode::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE.to_string(),
            "UC RDMA WRITE LAST WITH IMMEDIATE"
        );
        assert_eq!(
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.to_string(),
            "UD SEND ONLY WITH IMMEDIATE"
        );
        assert_eq!(Opcode::CNP.to_string(), "CNP");
        assert_eq!(Opcode(0x15).to_string(), "UNKNOWN(0x15)");
        for op in 0..=u8::MAX {
            if Opcode(op).is_supported() {
                let name = Opcode(op).name().unwrap();
                let info = Opcode(op).info().unwrap();
                assert!(name.starts_with(&info.transport.to_string()), "{name}");
            }
        }
        assert_eq!(Transport::Ud.opcode_base(), 0x60);
    }
}
