//! The General Services Interface of the port: QP1, which carries management datagrams
//! (MADs) such as the connection manager's REQ / REP / RTU (IBTA vol. 1 13.4 MAD formats,
//! 13.5 management datagram transport and QP1, 14 (subnet management): on RoCE there is
//! no QP0 and every MAD is a general-services MAD through QP1).
//!
//! On RoCEv2 a MAD travels as a UD SEND ONLY packet (opcode 0x64) to BTH DestQP 1, with a
//! DETH whose Q_Key is the well-known GSI Q_Key 0x80010000 and whose SrcQP is 1 (IBTA
//! 13.5: QP1 and its Q_Key 0x80010000), P_Key 0xFFFF (the default partition,
//! full member), and the IP header standing in for the GRH. Kernel rxe sends its MADs that
//! way, with a PSN of its own choosing, so the PSN is neither checked here nor meaningful in
//! what we send.
//!
//! The engine holds no QP1 state machine: received MADs are queued in a bounded inbox with
//! the sender's GID and QP, for the device's user to take ([`Engine::poll_gsi`]), and MADs
//! to send in a bounded outbox that [`Engine::poll_transmit`] drains first. Both bounds are
//! fixed ([`GSI_INBOX_LEN`], [`GSI_OUTBOX_LEN`]): a flood of MADs costs dropped packets,
//! counted as [`DropReason::GsiInboxFull`], never memory.
//!
//! [`Engine::poll_gsi`]: crate::Engine::poll_gsi
//! [`Engine::poll_transmit`]: crate::Engine::poll_transmit

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::codec::{self, op, Bth, Deth, Headers, Packet};
use crate::error::{Queue, VerbsError};
use crate::output::{Counters, DropReason, Transmit};
use crate::types::AddressVector;

/// The QP number of the General Services Interface (IBTA 13.5: QP1 is the GSI QP).
pub const GSI_QPN: u32 = 1;
/// The Q_Key every QP1 datagram carries (IBTA 13.5: 0x80010000, the well-known GSI
/// Q_Key, whose high bit makes it a controlled Q_Key).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The length of a MAD (IBTA 13.4: every MAD is 256 bytes). Received datagrams up to
/// this length are accepted (the consumer checks a MAD's own fields), longer ones dropped.
pub const MAD_LEN: usize = 256;
/// How many received MADs wait at most for [`Engine::poll_gsi`](crate::Engine::poll_gsi);
/// the next one is dropped as [`DropReason::GsiInboxFull`].
pub const GSI_INBOX_LEN: usize = 256;
/// How many MADs wait at most to be sent; the next
/// [`Engine::gsi_send`](crate::Engine::gsi_send) is refused with
/// [`VerbsError::QueueFull`] (`ENOMEM`).
pub const GSI_OUTBOX_LEN: usize = 256;

/// The P_Key QP1 datagrams are sent with: the default partition, full member.
const GSI_PKEY: u16 = 0xFFFF;
/// The hop limit (IP TTL) of a MAD sent through QP1, as of any RoCEv2 packet by default.
const GSI_HOP_LIMIT: u8 = 64;

/// One management datagram received on QP1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GsiMad {
    /// The sender's GID, read from the GRH (an IPv4 source as `::ffff:a.b.c.d`).
    pub sgid: [u8; 16],
    /// The sender's QP (DETH SrcQP): 1 for a GSI, another QP for a client sending from
    /// its own UD QP.
    pub src_qpn: u32,
    /// The BTH P_Key it came with.
    pub pkey: u16,
    /// The datagram's payload: the MAD (at most [`MAD_LEN`] bytes).
    pub bytes: Vec<u8>,
}

/// A MAD waiting to be sent.
#[derive(Debug)]
struct Outgoing {
    dgid: [u8; 16],
    sgid_index: u8,
    bytes: Vec<u8>,
}

/// QP1 of one engine: the inbox, the outbox and the PSN of what it sends.
#[derive(Debug, Default)]
pub(crate) struct Gsi {
    inbox: VecDeque<GsiMad>,
    outbox: VecDeque<Outgoing>,
    psn: u32,
}

impl Gsi {
    /// Takes a packet for DestQP 1: a MAD is queued, anything else dropped and counted.
    pub(crate) fn handle_packet(
        &mut self,
        pkt: &Packet<'_>,
        grh: Option<&[u8; 40]>,
        counters: &mut Counters,
    ) {
        let (qpn, psn) = (pkt.hdr.bth.dest_qp, pkt.hdr.bth.psn);
        // A MAD is a UD SEND ONLY without immediate (IBTA 13.5); any other opcode (RC,
        // UC, RDMA, an immediate) is not for QP1.
        if pkt.hdr.bth.opcode != op::UD_SEND_ONLY {
            counters.drop_packet(DropReason::WrongTransport, qpn, psn);
            return;
        }
        let Some(deth) = pkt.hdr.deth else {
            counters.drop_packet(DropReason::Malformed, qpn, psn);
            return;
        };
        if deth.qkey != GSI_QKEY {
            counters.drop_packet(DropReason::QkeyMismatch, qpn, psn);
            return;
        }
        // RoCE carries every MAD with a GRH (the IP header): the sender's GID comes from it.
        let Some(grh) = grh else {
            counters.drop_packet(DropReason::Malformed, qpn, psn);
            return;
        };
        if pkt.payload.is_empty() || pkt.payload.len() > MAD_LEN {
            counters.drop_packet(DropReason::Malformed, qpn, psn);
            return;
        }
        if self.inbox.len() >= GSI_INBOX_LEN {
            counters.drop_packet(DropReason::GsiInboxFull, qpn, psn);
            return;
        }
        counters.gsi_received += 1;
        self.inbox.push_back(GsiMad {
            sgid: grh_source_gid(grh),
            src_qpn: deth.src_qp,
            pkey: pkt.hdr.bth.pkey,
            bytes: pkt.payload.to_vec(),
        });
    }

    /// Queues a MAD for `dgid`.
    pub(crate) fn send(
        &mut self,
        dgid: [u8; 16],
        sgid_index: u8,
        bytes: &[u8],
    ) -> Result<(), VerbsError> {
        if bytes.is_empty() || bytes.len() > MAD_LEN {
            return Err(VerbsError::MadLength {
                len: bytes.len(),
                max: MAD_LEN,
            });
        }
        if self.outbox.len() >= GSI_OUTBOX_LEN {
            return Err(VerbsError::QueueFull { queue: Queue::Gsi });
        }
        self.outbox.push_back(Outgoing {
            dgid,
            sgid_index,
            bytes: bytes.to_vec(),
        });
        Ok(())
    }

    /// The next received MAD.
    pub(crate) fn poll(&mut self) -> Option<GsiMad> {
        self.inbox.pop_front()
    }

    /// How many received MADs wait.
    pub(crate) fn pending(&self) -> usize {
        self.inbox.len()
    }

    /// Whether MADs wait to be sent.
    pub(crate) fn has_transmit(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// Writes the next MAD to send into `buf` as a UD SEND ONLY to QP1.
    #[inline]
    pub(crate) fn poll_transmit(
        &mut self,
        buf: &mut [u8],
        counters: &mut Counters,
    ) -> Option<Transmit> {
        if self.outbox.is_empty() {
            return None;
        }
        self.poll_outbox(buf, counters)
    }

    /// [`Gsi::poll_transmit`] with MADs waiting.
    fn poll_outbox(&mut self, buf: &mut [u8], counters: &mut Counters) -> Option<Transmit> {
        while let Some(out) = self.outbox.pop_front() {
            let hdr = Headers {
                bth: Bth {
                    opcode: op::UD_SEND_ONLY,
                    pkey: GSI_PKEY,
                    dest_qp: GSI_QPN,
                    psn: self.psn,
                    ..Bth::default()
                },
                deth: Some(Deth {
                    qkey: GSI_QKEY,
                    src_qp: GSI_QPN,
                }),
                ..Headers::default()
            };
            let Some((start, len)) = codec::emit_headers(&hdr, out.bytes.len(), buf) else {
                // Only a buffer shorter than `max_packet_len` gets here.
                tracing::debug!(
                    len = out.bytes.len(),
                    "MAD does not fit the buffer: dropped"
                );
                continue;
            };
            buf[start..start + out.bytes.len()].copy_from_slice(&out.bytes);
            self.psn = (self.psn + 1) & 0xFF_FFFF;
            counters.packets_sent += 1;
            counters.bytes_sent += out.bytes.len() as u64;
            counters.gsi_sent += 1;
            return Some(Transmit {
                len,
                src_qpn: GSI_QPN,
                dest_qpn: GSI_QPN,
                av: AddressVector {
                    dgid: out.dgid,
                    sgid_index: out.sgid_index,
                    hop_limit: GSI_HOP_LIMIT,
                    port_num: 1,
                    is_global: true,
                    ..AddressVector::default()
                },
            });
        }
        None
    }
}

/// The source and destination addresses of a GRH area (the form a UD receive gets: an
/// IPv6 header, or 20 zero bytes then the IPv4 header).
pub(crate) fn grh_addresses(grh: &[u8; 40]) -> (IpAddr, IpAddr) {
    if grh[0] >> 4 == 6 {
        let mut source = [0u8; 16];
        let mut local = [0u8; 16];
        source.copy_from_slice(&grh[8..24]);
        local.copy_from_slice(&grh[24..40]);
        (
            IpAddr::V6(Ipv6Addr::from(source)),
            IpAddr::V6(Ipv6Addr::from(local)),
        )
    } else {
        let ipv4 = |at: usize| {
            IpAddr::V4(Ipv4Addr::new(
                grh[at],
                grh[at + 1],
                grh[at + 2],
                grh[at + 3],
            ))
        };
        (ipv4(32), ipv4(36))
    }
}

/// The source of a GRH area as a GID (an IPv4 source as `::ffff:a.b.c.d`).
pub(crate) fn grh_source_gid(grh: &[u8; 40]) -> [u8; 16] {
    ip_gid(grh_addresses(grh).0)
}

/// The destination of a GRH area as a GID (an IPv4 destination as `::ffff:a.b.c.d`): a
/// multicast packet's group.
pub(crate) fn grh_destination_gid(grh: &[u8; 40]) -> [u8; 16] {
    ip_gid(grh_addresses(grh).1)
}

/// The GID of an IP address (IPv4 as `::ffff:a.b.c.d`).
fn ip_gid(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}
