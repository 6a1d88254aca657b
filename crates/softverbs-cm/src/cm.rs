//! [`Cm`]: the connection manager of one port — the IBTA chapter 12 state machines
//! (connection establishment 12.6/12.9, disconnection 12.9.7, timewait 12.9.8.3, SIDR 12.11)
//! over MADs given in and taken out, with timers driven by the caller's clock.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::mad::{
    self, reject_reason, sidr_status, CmMessage, Drep, Dreq, MessageKind, Mra, Rej, Rep, Req,
    ReqPath, Rtu, SidrRep, SidrReq, MAD_LEN, PERMISSIVE_LID,
};
use crate::types::max_private_data as max;
use crate::types::{
    CmConfig, CmCounters, CmError, CmEvent, ConnId, ConnState, ConnectRequest, MadSource,
    OutgoingMad, QpType, RepInfo, Reply, ReqInfo, SidrReply, SidrRequest,
};

/// Live connections a `Cm` keeps at most; a REQ beyond is rejected (reason 3, no
/// resources) and `connect` fails with [`CmError::TooManyConnections`].
pub const MAX_CONNECTIONS: usize = 65_536;
/// MADs waiting for `poll_transmit` at most; beyond, a MAD is dropped and counted (the
/// retransmission timers recover).
pub const MAX_QUEUED_TRANSMITS: usize = 4096;

/// 4.096 µs × 2^t in nanoseconds (IBTA 12.7.1 timeout encoding); `t` is capped at 31.
pub fn cm_timeout_ns(t: u8) -> u64 {
    4096u64 << u32::from(t.min(31))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Active,
    Passive,
    SidrActive,
    SidrPassive,
}

#[derive(Debug, Clone, Copy)]
struct Timer {
    deadline: u64,
    interval: u64,
    retries_left: u8,
}

#[derive(Debug, Clone)]
struct Conn {
    role: Role,
    state: ConnState,
    remote_comm_id: u32,
    remote_ca_guid: u64,
    dgid: [u8; 16],
    local_qpn: u32,
    remote_qpn: u32,
    service_id: u64,
    /// Transaction ID of the messages this side starts (REQ, RTU, DREQ, SIDR_REQ).
    tid: u64,
    /// Transaction ID of the peer's request being answered (REP/MRA/REJ to a REQ, DREP).
    peer_tid: u64,
    /// Exponent: how long the peer's CM may take to answer us.
    peer_response_timeout: u8,
    max_cm_retries: u8,
    timewait_ns: u64,
    /// The last message sent that a timer retransmits or a duplicate re-elicits.
    last: Option<[u8; MAD_LEN]>,
    timer: Option<Timer>,
    released: bool,
}

/// Outputs and counters, apart from the connection table so both can be borrowed.
#[derive(Debug, Default)]
struct Out {
    transmits: VecDeque<OutgoingMad>,
    events: VecDeque<CmEvent>,
    counters: CmCounters,
}

impl Out {
    fn send(&mut self, dgid: [u8; 16], bytes: [u8; MAD_LEN]) {
        if self.transmits.len() >= MAX_QUEUED_TRANSMITS {
            self.counters.transmit_queue_full += 1;
            return;
        }
        self.counters.mads_sent += 1;
        self.transmits.push_back(OutgoingMad {
            dgid,
            dest_qpn: 1,
            bytes,
        });
    }

    fn event(&mut self, conn: &Conn, event: CmEvent) {
        if !conn.released {
            self.events.push_back(event);
        }
    }
}

fn live(conns: &mut BTreeMap<u32, Conn>, conn: ConnId) -> Result<&mut Conn, CmError> {
    conns
        .get_mut(&conn.0)
        .filter(|c| !c.released)
        .ok_or(CmError::UnknownConnection(conn))
}

fn encode(write: impl FnOnce(&mut [u8; MAD_LEN])) -> [u8; MAD_LEN] {
    let mut bytes = [0u8; MAD_LEN];
    write(&mut bytes);
    bytes
}

fn check_private_data<const N: usize>(data: &[u8]) -> Result<[u8; N], CmError> {
    mad::private_data::<N>(data).ok_or(CmError::PrivateDataTooLong {
        len: data.len(),
        max: N,
    })
}

/// The communication manager of one port (IBTA chapter 12), sans I/O.
///
/// # Calling contract
///
/// - Inputs: the consumer calls (`listen`, `connect`, `accept`, …), received MADs
///   ([`Cm::handle_mad`]) and the clock ([`Cm::handle_timeout`]). Every input that can
///   start a timer takes `now`, nanoseconds on any monotonic clock; `now` never goes back.
/// - Outputs: after any input, drain [`Cm::poll_transmit`] (send each MAD as a UD SEND to
///   QP 1 of `dgid`, Q_Key 0x80010000) and [`Cm::poll_event`], then sleep until
///   [`Cm::poll_timeout`] (or the next MAD) and call [`Cm::handle_timeout`].
/// - A connection is named by a [`ConnId`] until [`Cm::release`]; after release no event
///   names it, and it disappears once any timewait is over.
/// - No input panics: malformed MADs are dropped and counted ([`Cm::counters`]).
#[derive(Debug)]
pub struct Cm {
    config: CmConfig,
    rng: u64,
    tid_high: u64,
    listeners: BTreeSet<u64>,
    conns: BTreeMap<u32, Conn>,
    /// Passive connections by (remote CA GUID, remote communication ID): duplicate REQs.
    by_remote: BTreeMap<(u64, u32), u32>,
    /// Passive SIDR requests by (source GID, request ID): duplicate SIDR_REQs.
    sidr_by_remote: BTreeMap<([u8; 16], u32), u32>,
    timewait_override: Option<u64>,
    /// How long a REQ for a service nobody listens on waits for a listener before REJ 8
    /// ([`Cm::set_unmatched_req_hold`]); 0: rejected at once.
    unmatched_hold: u64,
    /// REQs waiting for a listener: (deadline, source, REQ), oldest first.
    held_reqs: Vec<(u64, MadSource, Req)>,
    /// The latest `now` given to any input (the start of a timewait `release` begins).
    clock: u64,
    out: Out,
}

impl Cm {
    /// A connection manager with no listener and no connection.
    pub fn new(config: CmConfig) -> Self {
        let mut cm = Self {
            config,
            rng: config.seed ^ 0x9E37_79B9_7F4A_7C15,
            tid_high: 0,
            listeners: BTreeSet::new(),
            conns: BTreeMap::new(),
            by_remote: BTreeMap::new(),
            sidr_by_remote: BTreeMap::new(),
            timewait_override: None,
            unmatched_hold: 0,
            held_reqs: Vec::new(),
            clock: 0,
            out: Out::default(),
        };
        if cm.rng == 0 {
            cm.rng = 1;
        }
        cm.tid_high = cm.random() & 0xFFFF_FFFF_0000_0000;
        cm
    }

    fn random(&mut self) -> u64 {
        // xorshift64*: deterministic from the seed.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn new_comm_id(&mut self) -> Result<u32, CmError> {
        if self.conns.len() >= MAX_CONNECTIONS {
            return Err(CmError::TooManyConnections);
        }
        // The high byte is the share (CmConfig::share), the low 24 bits random and not 0;
        // MAX_CONNECTIONS is far below 2^24, so a free one is found.
        let share = u32::from(self.config.share) << mad::COMM_ID_SHARE_SHIFT;
        loop {
            let low = (self.random() >> 40) as u32;
            let id = share | low;
            if low != 0 && !self.conns.contains_key(&id) {
                return Ok(id);
            }
        }
    }

    /// Sets the timewait of every connection that enters it from now on (by default
    /// 2 × 4.096 µs × 2^`local_ack_timeout` of the connection, at least 1 ms).
    pub fn set_timewait(&mut self, timewait_ns: Option<u64>) {
        self.timewait_override = timewait_ns;
    }

    fn timewait_for(&self, local_ack_timeout: u8) -> u64 {
        self.timewait_override
            .unwrap_or_else(|| (2 * cm_timeout_ns(local_ack_timeout)).max(1_000_000))
    }

    /// What the CM counted.
    pub fn counters(&self) -> CmCounters {
        self.out.counters
    }

    /// The state of a connection, or `None` if it does not exist (or was released).
    pub fn state(&self, conn: ConnId) -> Option<ConnState> {
        self.conns
            .get(&conn.0)
            .filter(|c| !c.released)
            .map(|c| c.state)
    }

    /// Makes a REQ for a service nobody listens on wait up to `hold_ns` for a listener
    /// (then it is taken as if it came after the listen) before it is rejected with reason
    /// 8. A program that connects as soon as its peer has said "listen now" over another
    /// channel may otherwise beat the peer's `rdma_listen` by microseconds; a kernel CM
    /// rejects at once (0, the default), but there the active side's address and route
    /// resolution usually take longer than that gap.
    pub fn set_unmatched_req_hold(&mut self, hold_ns: u64) {
        self.unmatched_hold = hold_ns;
    }

    /// Accepts REQs and SIDR_REQs for `service_id` (exact match), REQs held for it
    /// ([`Cm::set_unmatched_req_hold`]) included.
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if !self.listeners.insert(service_id) {
            return Err(CmError::AddressInUse(service_id));
        }
        let (now_matching, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held_reqs)
            .into_iter()
            .partition(|(_, _, req)| req.service_id == service_id);
        self.held_reqs = rest;
        for (_, from, req) in now_matching {
            self.on_req(from, req);
        }
        Ok(())
    }

    /// Stops accepting `service_id`: later REQs get REJ reason 8.
    pub fn unlisten(&mut self, service_id: u64) {
        self.listeners.remove(&service_id);
    }

    fn tick(&mut self, now: u64) {
        self.clock = self.clock.max(now);
    }

    /// Active side: sends a REQ and arms its retransmission timer (IBTA 12.9.5.1).
    pub fn connect(&mut self, now: u64, req: ConnectRequest) -> Result<ConnId, CmError> {
        self.tick(now);
        let private_data = check_private_data::<{ max::REQ }>(&req.private_data)?;
        if req.local_qpn > 0xFF_FFFF || req.local_qpn < 2 {
            return Err(CmError::InvalidParameter("local_qpn"));
        }
        if !(1..=5).contains(&req.path_mtu) {
            return Err(CmError::InvalidParameter("path_mtu"));
        }
        if req.retry_count > 7 || req.rnr_retry_count > 7 || req.sl > 15 {
            return Err(CmError::InvalidParameter(
                "retry_count / rnr_retry_count / sl",
            ));
        }
        if req.max_cm_retries > 15
            || req.local_cm_response_timeout > 31
            || req.remote_cm_response_timeout > 31
            || req.local_ack_timeout > 31
        {
            return Err(CmError::InvalidParameter("CM timeouts / retries"));
        }
        let id = self.new_comm_id()?;
        let tid = self.tid_high | u64::from(id);
        let routed = req.hop_limit > 1;
        let lid = if routed { PERMISSIVE_LID } else { 0 };
        let msg = Req {
            transaction_id: tid,
            local_comm_id: id,
            service_id: req.service_id,
            local_ca_guid: self.config.local_ca_guid,
            local_qkey: 0,
            local_qpn: req.local_qpn,
            responder_resources: req.responder_resources,
            local_eecn: 0,
            initiator_depth: req.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: req.remote_cm_response_timeout,
            transport_service_type: req.qp_type.value(),
            end_to_end_flow_control: req.flow_control,
            starting_psn: req.starting_psn & 0xFF_FFFF,
            local_cm_response_timeout: req.local_cm_response_timeout,
            retry_count: req.retry_count,
            partition_key: req.pkey,
            path_mtu: req.path_mtu,
            rdc_exists: false,
            rnr_retry_count: req.rnr_retry_count,
            max_cm_retries: req.max_cm_retries,
            srq: req.srq,
            extended_transport_type: 0,
            primary_path: ReqPath {
                local_lid: lid,
                remote_lid: lid,
                local_gid: req.local_gid,
                remote_gid: req.remote_gid,
                flow_label: req.flow_label & 0xF_FFFF,
                packet_rate: req.packet_rate & 0x3F,
                traffic_class: req.traffic_class,
                hop_limit: req.hop_limit,
                sl: req.sl,
                subnet_local: !routed,
                local_ack_timeout: req.local_ack_timeout,
            },
            alternate_path: ReqPath::default(),
            sap_supported: false,
            private_data,
        };
        let bytes = encode(|m| msg.write(m));
        let interval = cm_timeout_ns(req.remote_cm_response_timeout);
        let conn = Conn {
            role: Role::Active,
            state: ConnState::ReqSent,
            remote_comm_id: 0,
            remote_ca_guid: 0,
            dgid: req.remote_gid,
            local_qpn: req.local_qpn,
            remote_qpn: 0,
            service_id: req.service_id,
            tid,
            peer_tid: tid,
            peer_response_timeout: req.remote_cm_response_timeout,
            max_cm_retries: req.max_cm_retries,
            timewait_ns: self.timewait_for(req.local_ack_timeout),
            last: Some(bytes),
            timer: Some(Timer {
                deadline: now.saturating_add(interval),
                interval,
                retries_left: req.max_cm_retries,
            }),
            released: false,
        };
        self.out.send(conn.dgid, bytes);
        self.conns.insert(id, conn);
        tracing::debug!(conn = %ConnId(id), service_id = req.service_id, "REQ sent");
        Ok(ConnId(id))
    }

    /// Passive side: answers a received REQ with a REP and waits for the RTU, retransmitting
    /// the REP (IBTA 12.9.5.2).
    pub fn accept(&mut self, now: u64, conn: ConnId, rep: Reply) -> Result<(), CmError> {
        self.tick(now);
        let private_data = check_private_data::<{ max::REP }>(&rep.private_data)?;
        if rep.local_qpn > 0xFF_FFFF || rep.local_qpn < 2 {
            return Err(CmError::InvalidParameter("local_qpn"));
        }
        if rep.rnr_retry_count > 7 || rep.target_ack_delay > 31 || rep.failover_accepted > 3 {
            return Err(CmError::InvalidParameter(
                "rnr_retry_count / target_ack_delay / failover_accepted",
            ));
        }
        let guid = self.config.local_ca_guid;
        let c = live(&mut self.conns, conn)?;
        if c.role != Role::Passive
            || !matches!(c.state, ConnState::ReqReceived | ConnState::MraReqSent)
        {
            return Err(CmError::InvalidState {
                conn,
                state: c.state,
            });
        }
        let msg = Rep {
            transaction_id: c.peer_tid,
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
            local_qkey: 0,
            local_qpn: rep.local_qpn,
            local_eecn: 0,
            starting_psn: rep.starting_psn & 0xFF_FFFF,
            responder_resources: rep.responder_resources,
            initiator_depth: rep.initiator_depth,
            target_ack_delay: rep.target_ack_delay,
            failover_accepted: rep.failover_accepted,
            end_to_end_flow_control: rep.flow_control,
            rnr_retry_count: rep.rnr_retry_count,
            srq: rep.srq,
            local_ca_guid: guid,
            private_data,
        };
        let bytes = encode(|m| msg.write(m));
        c.local_qpn = rep.local_qpn;
        c.state = ConnState::RepSent;
        c.last = Some(bytes);
        let interval = cm_timeout_ns(c.peer_response_timeout);
        c.timer = Some(Timer {
            deadline: now.saturating_add(interval),
            interval,
            retries_left: c.max_cm_retries,
        });
        self.out.send(c.dgid, bytes);
        Ok(())
    }

    /// Rejects a connection being set up (IBTA 12.6.7): the passive side before REP (the
    /// REQ is rejected), the active side after REP (the REP is rejected), or either side
    /// giving up. `reason` 28 is the consumer's reject; `private_data` ≤ 148 bytes.
    pub fn reject(
        &mut self,
        now: u64,
        conn: ConnId,
        reason: u16,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        self.tick(now);
        let private_data = check_private_data::<{ max::REJ }>(private_data)?;
        let c = live(&mut self.conns, conn)?;
        let message_rejected = match c.state {
            ConnState::ReqReceived | ConnState::MraReqSent => MessageKind::Req,
            ConnState::RepReceived | ConnState::MraRepSent => MessageKind::Rep,
            ConnState::ReqSent
            | ConnState::MraReqReceived
            | ConnState::RepSent
            | ConnState::MraRepReceived => MessageKind::Other,
            state => return Err(CmError::InvalidState { conn, state }),
        };
        let msg = Rej {
            transaction_id: c.peer_tid,
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
            message_rejected,
            reject_info_length: 0,
            reason,
            ari: [0; mad::REJ_ARI_LEN],
            private_data,
        };
        let bytes = encode(|m| msg.write(m));
        c.state = ConnState::Idle;
        c.timer = None;
        c.last = None;
        self.out.send(c.dgid, bytes);
        Ok(())
    }

    /// Sends an MRA: the consumer needs `service_timeout` (exponent) more to answer the REQ
    /// (passive) or the REP (active) (IBTA 12.6.6).
    pub fn send_mra(
        &mut self,
        now: u64,
        conn: ConnId,
        service_timeout: u8,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        self.tick(now);
        let private_data = check_private_data::<{ max::MRA }>(private_data)?;
        if service_timeout > 31 {
            return Err(CmError::InvalidParameter("service_timeout"));
        }
        let c = live(&mut self.conns, conn)?;
        let (message_mraed, next) = match c.state {
            ConnState::ReqReceived => (MessageKind::Req, ConnState::MraReqSent),
            ConnState::RepReceived => (MessageKind::Rep, ConnState::MraRepSent),
            state => return Err(CmError::InvalidState { conn, state }),
        };
        let msg = Mra {
            transaction_id: c.peer_tid,
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
            message_mraed,
            service_timeout,
            private_data,
        };
        let bytes = encode(|m| msg.write(m));
        c.state = next;
        c.last = Some(bytes);
        self.out.send(c.dgid, bytes);
        Ok(())
    }

    /// Active side: sends the RTU after the REP; the connection is established
    /// (IBTA 12.9.5.1). A duplicate REP later gets this RTU again.
    pub fn ready_to_use(
        &mut self,
        now: u64,
        conn: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        self.tick(now);
        let private_data = check_private_data::<{ max::RTU }>(private_data)?;
        let c = live(&mut self.conns, conn)?;
        if c.role != Role::Active
            || !matches!(c.state, ConnState::RepReceived | ConnState::MraRepSent)
        {
            return Err(CmError::InvalidState {
                conn,
                state: c.state,
            });
        }
        let msg = Rtu {
            transaction_id: c.tid,
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
            private_data,
        };
        let bytes = encode(|m| msg.write(m));
        c.state = ConnState::Established;
        c.last = Some(bytes);
        c.timer = None;
        self.out.send(c.dgid, bytes);
        Ok(())
    }

    /// Passive side: the QP received a packet before the RTU (or the consumer calls
    /// `rdma_establish`): the connection is established as if the RTU arrived (IBTA
    /// 12.9.5.2, communication established event). Queues [`CmEvent::RtuReceived`] with
    /// no private data; does nothing in any other state.
    pub fn notify_established(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn.0) else {
            return;
        };
        if c.role == Role::Passive
            && matches!(c.state, ConnState::RepSent | ConnState::MraRepReceived)
        {
            c.state = ConnState::Established;
            c.timer = None;
            c.last = None;
            let event = CmEvent::RtuReceived {
                conn,
                private_data: Vec::new(),
            };
            self.out.event(c, event);
        }
    }

    /// Disconnects: from an established connection sends a DREQ and retransmits it until
    /// a DREP (IBTA 12.9.7); after a DREQ was received, sends the DREP and enters timewait.
    pub fn disconnect(
        &mut self,
        now: u64,
        conn: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        self.tick(now);
        let c = self.conns.get(&conn.0).filter(|c| !c.released);
        let state = c.map(|c| c.state).ok_or(CmError::UnknownConnection(conn))?;
        match state {
            ConnState::Established | ConnState::RepSent | ConnState::MraRepReceived => {
                let private_data = check_private_data::<{ max::DREQ }>(private_data)?;
                let c = live(&mut self.conns, conn)?;
                let msg = Dreq {
                    transaction_id: c.tid,
                    local_comm_id: conn.0,
                    remote_comm_id: c.remote_comm_id,
                    remote_qpn: c.remote_qpn,
                    private_data,
                };
                let bytes = encode(|m| msg.write(m));
                c.state = ConnState::DreqSent;
                c.last = Some(bytes);
                let interval = cm_timeout_ns(c.peer_response_timeout);
                c.timer = Some(Timer {
                    deadline: now.saturating_add(interval),
                    interval,
                    retries_left: c.max_cm_retries,
                });
                self.out.send(c.dgid, bytes);
                Ok(())
            }
            ConnState::DreqReceived => {
                let private_data = check_private_data::<{ max::DREP }>(private_data)?;
                let c = live(&mut self.conns, conn)?;
                let msg = Drep {
                    transaction_id: c.peer_tid,
                    local_comm_id: conn.0,
                    remote_comm_id: c.remote_comm_id,
                    private_data,
                };
                let bytes = encode(|m| msg.write(m));
                c.last = Some(bytes);
                self.out.send(c.dgid, bytes);
                self.enter_timewait(now, conn.0);
                Ok(())
            }
            state => Err(CmError::InvalidState { conn, state }),
        }
    }

    /// Active SIDR: sends a SIDR_REQ and retransmits it until the SIDR_REP (IBTA 12.11).
    pub fn sidr_request(&mut self, now: u64, req: SidrRequest) -> Result<ConnId, CmError> {
        self.tick(now);
        let private_data = check_private_data::<{ max::SIDR_REQ }>(&req.private_data)?;
        if req.cm_response_timeout > 31 || req.max_cm_retries > 15 {
            return Err(CmError::InvalidParameter(
                "cm_response_timeout / max_cm_retries",
            ));
        }
        let id = self.new_comm_id()?;
        let tid = self.tid_high | u64::from(id);
        let msg = SidrReq {
            transaction_id: tid,
            request_id: id,
            partition_key: req.pkey,
            service_id: req.service_id,
            private_data,
        };
        let bytes = encode(|m| msg.write(m));
        let interval = cm_timeout_ns(req.cm_response_timeout);
        let conn = Conn {
            role: Role::SidrActive,
            state: ConnState::SidrReqSent,
            remote_comm_id: 0,
            remote_ca_guid: 0,
            dgid: req.remote_gid,
            local_qpn: 0,
            remote_qpn: 0,
            service_id: req.service_id,
            tid,
            peer_tid: tid,
            peer_response_timeout: req.cm_response_timeout,
            max_cm_retries: req.max_cm_retries,
            timewait_ns: 0,
            last: Some(bytes),
            timer: Some(Timer {
                deadline: now.saturating_add(interval),
                interval,
                retries_left: req.max_cm_retries,
            }),
            released: false,
        };
        self.out.send(conn.dgid, bytes);
        self.conns.insert(id, conn);
        Ok(ConnId(id))
    }

    /// Passive SIDR: answers a received SIDR_REQ. A duplicate SIDR_REQ later gets the same
    /// answer.
    pub fn sidr_reply(&mut self, now: u64, conn: ConnId, rep: SidrReply) -> Result<(), CmError> {
        self.tick(now);
        let private_data = check_private_data::<{ max::SIDR_REP }>(&rep.private_data)?;
        if rep.qpn > 0xFF_FFFF {
            return Err(CmError::InvalidParameter("qpn"));
        }
        let c = live(&mut self.conns, conn)?;
        if c.state != ConnState::SidrReqReceived {
            return Err(CmError::InvalidState {
                conn,
                state: c.state,
            });
        }
        let msg = SidrRep {
            transaction_id: c.peer_tid,
            request_id: c.remote_comm_id,
            status: rep.status,
            additional_information_length: 0,
            qpn: rep.qpn,
            service_id: c.service_id,
            qkey: rep.qkey,
            additional_information: [0; mad::SIDR_REP_INFO_LEN],
            private_data,
        };
        let bytes = encode(|m| msg.write(m));
        c.state = ConnState::SidrReplied;
        c.last = Some(bytes);
        self.out.send(c.dgid, bytes);
        Ok(())
    }

    /// The consumer destroyed its id: forget the connection, as the kernel's
    /// `ib_destroy_cm_id` does — a connection being set up is rejected (REJ 4 timeout by
    /// the active side before REP, REJ 28 otherwise), an established one sends a DREQ (once)
    /// and enters timewait, one in timewait is removed when timewait ends. No event names
    /// the connection afterwards.
    pub fn release(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get(&conn.0) else {
            return;
        };
        if c.released {
            return;
        }
        let state = c.state;
        let guid = self.config.local_ca_guid;
        match state {
            ConnState::ReqSent | ConnState::MraReqReceived => {
                if let Some(c) = self.conns.get(&conn.0) {
                    let bytes = timeout_rej(c, conn.0, guid, MessageKind::Other);
                    self.out.send(c.dgid, bytes);
                }
                self.remove(conn.0);
            }
            ConnState::ReqReceived
            | ConnState::MraReqSent
            | ConnState::RepReceived
            | ConnState::MraRepSent
            | ConnState::RepSent
            | ConnState::MraRepReceived => {
                let now = self.clock;
                let _ = self.reject(now, conn, reject_reason::CONSUMER, &[]);
                self.remove(conn.0);
            }
            ConnState::Established => {
                // One DREQ, no retransmission, then timewait (the kernel cancels the DREQ
                // as it destroys the id).
                let now = self.clock;
                let _ = self.disconnect(now, conn, &[]);
                self.mark_released_into_timewait(now, conn.0);
            }
            ConnState::DreqSent => self.mark_released_into_timewait(self.clock, conn.0),
            ConnState::DreqReceived => {
                let now = self.clock;
                let _ = self.disconnect(now, conn, &[]);
                self.mark_released_into_timewait(now, conn.0);
            }
            ConnState::Timewait => {
                if let Some(c) = self.conns.get_mut(&conn.0) {
                    c.released = true;
                }
            }
            ConnState::Idle
            | ConnState::SidrReqSent
            | ConnState::SidrReqReceived
            | ConnState::SidrReplied => self.remove(conn.0),
        }
    }

    fn mark_released_into_timewait(&mut self, now: u64, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.released = true;
        if c.state != ConnState::Timewait {
            self.enter_timewait(now, id);
        }
    }

    fn remove(&mut self, id: u32) {
        if let Some(c) = self.conns.remove(&id) {
            if c.role == Role::Passive {
                self.by_remote.remove(&(c.remote_ca_guid, c.remote_comm_id));
            }
            if c.role == Role::SidrPassive {
                self.sidr_by_remote.remove(&(c.dgid, c.remote_comm_id));
            }
        }
    }

    fn enter_timewait(&mut self, now: u64, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = ConnState::Timewait;
            c.timer = Some(Timer {
                deadline: now.saturating_add(c.timewait_ns),
                interval: c.timewait_ns,
                retries_left: 0,
            });
        }
    }

    /// The next MAD to send, if any.
    pub fn poll_transmit(&mut self) -> Option<OutgoingMad> {
        self.out.transmits.pop_front()
    }

    /// The next event for the consumer, if any.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.out.events.pop_front()
    }

    /// When [`Cm::handle_timeout`] should next be called, if any timer runs.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.conns
            .values()
            .filter_map(|c| c.timer.map(|t| t.deadline))
            .chain(self.held_reqs.first().map(|(deadline, _, _)| *deadline))
            .min()
    }

    /// Runs the timers due at `now`: retransmissions (REQ, REP, DREQ, SIDR_REQ), their
    /// exhaustion, and the end of timewait.
    pub fn handle_timeout(&mut self, now: u64) {
        self.tick(now);
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.timer.is_some_and(|t| t.deadline <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            self.expire(now, id);
        }
        // REQs whose wait for a listener is over (held in arrival order, so the due ones
        // are at the front).
        let due = self
            .held_reqs
            .iter()
            .take_while(|(deadline, _, _)| *deadline <= now)
            .count();
        for (_, from, req) in self.held_reqs.drain(..due).collect::<Vec<_>>() {
            self.out.counters.no_listener += 1;
            self.reject_unsolicited(from, &req, reject_reason::INVALID_SERVICE_ID);
        }
    }

    fn expire(&mut self, now: u64, id: u32) {
        let guid = self.config.local_ca_guid;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let Some(timer) = c.timer else {
            return;
        };
        let conn = ConnId(id);
        if c.state == ConnState::Timewait {
            c.timer = None;
            c.state = ConnState::Idle;
            if c.released {
                self.remove(id);
            } else {
                let event = CmEvent::TimewaitExit { conn };
                self.out.event(c, event);
            }
            return;
        }
        if timer.retries_left > 0 {
            c.timer = Some(Timer {
                deadline: now.saturating_add(timer.interval),
                interval: timer.interval,
                retries_left: timer.retries_left - 1,
            });
            if let Some(bytes) = c.last {
                self.out.counters.retransmissions += 1;
                self.out.send(c.dgid, bytes);
            }
            return;
        }
        c.timer = None;
        match c.state {
            ConnState::ReqSent | ConnState::MraReqReceived => {
                let bytes = timeout_rej(c, id, guid, MessageKind::Req);
                c.state = ConnState::Idle;
                c.last = None;
                self.out.send(c.dgid, bytes);
                self.out.event(c, CmEvent::Timeout { conn });
            }
            ConnState::RepSent | ConnState::MraRepReceived => {
                let bytes = timeout_rej(c, id, guid, MessageKind::Rep);
                c.state = ConnState::Idle;
                c.last = None;
                self.out.send(c.dgid, bytes);
                self.out.event(c, CmEvent::Timeout { conn });
            }
            ConnState::DreqSent => {
                self.out.event(c, CmEvent::DreqTimeout { conn });
                self.enter_timewait(now, id);
            }
            ConnState::SidrReqSent => {
                c.state = ConnState::Idle;
                c.last = None;
                self.out.event(c, CmEvent::SidrTimeout { conn });
            }
            _ => {}
        }
    }

    /// Takes one received MAD (the 256 bytes of a UD SEND to QP 1). Malformed or unexpected
    /// MADs are dropped and counted; a REQ for a service nobody listens on is answered
    /// with REJ reason 8; duplicates are answered as IBTA 12.9 says.
    pub fn handle_mad(&mut self, now: u64, from: MadSource, bytes: &[u8]) {
        self.tick(now);
        self.out.counters.mads_received += 1;
        let msg = match CmMessage::parse(bytes) {
            Ok(m) => m,
            Err(mad::CmParseError::UnknownAttribute(a)) => {
                tracing::trace!(attribute = a, "CM MAD of unknown attribute dropped");
                self.out.counters.ignored_attribute += 1;
                return;
            }
            Err(e) => {
                tracing::trace!(error = %e, "malformed CM MAD dropped");
                self.out.counters.malformed += 1;
                return;
            }
        };
        tracing::trace!(%msg, "CM MAD received");
        match msg {
            CmMessage::Req(m) => self.on_req(from, *m),
            CmMessage::Mra(m) => self.on_mra(now, *m),
            CmMessage::Rej(m) => self.on_rej(now, *m),
            CmMessage::Rep(m) => self.on_rep(*m),
            CmMessage::Rtu(m) => self.on_rtu(*m),
            CmMessage::Dreq(m) => self.on_dreq(from, *m),
            CmMessage::Drep(m) => self.on_drep(now, *m),
            CmMessage::SidrReq(m) => self.on_sidr_req(from, *m),
            CmMessage::SidrRep(m) => self.on_sidr_rep(*m),
            CmMessage::Ignored(_) => self.out.counters.ignored_attribute += 1,
        }
    }

    fn unmatched(&mut self, what: &str) {
        tracing::trace!(
            what,
            "CM message matches no connection in a state to take it"
        );
        self.out.counters.unmatched += 1;
    }

    /// Rejects a REQ that made no connection (the kernel's `cm_issue_rej`).
    fn reject_unsolicited(&mut self, from: MadSource, req: &Req, reason: u16) {
        let msg = Rej {
            transaction_id: req.transaction_id,
            local_comm_id: 0,
            remote_comm_id: req.local_comm_id,
            message_rejected: MessageKind::Req,
            reject_info_length: 0,
            reason,
            ari: [0; mad::REJ_ARI_LEN],
            private_data: [0; mad::REJ_PRIVATE_DATA_LEN],
        };
        self.out.send(from.sgid, encode(|m| msg.write(m)));
    }

    fn on_req(&mut self, from: MadSource, req: Req) {
        if let Some(&id) = self.by_remote.get(&(req.local_ca_guid, req.local_comm_id)) {
            self.out.counters.duplicates += 1;
            let Some(c) = self.conns.get(&id) else {
                return;
            };
            match c.state {
                ConnState::RepSent | ConnState::MraReqSent | ConnState::MraRepReceived => {
                    if let Some(bytes) = c.last {
                        self.out.send(c.dgid, bytes);
                    }
                }
                ConnState::Timewait => {
                    self.reject_unsolicited(from, &req, reject_reason::STALE_CONNECTION)
                }
                _ => {}
            }
            return;
        }
        let qp_type = match req.transport_service_type {
            0 => QpType::Rc,
            1 => QpType::Uc,
            _ => {
                self.reject_unsolicited(from, &req, reject_reason::INVALID_TRANSPORT_TYPE);
                return;
            }
        };
        if !self.listeners.contains(&req.service_id) {
            let held = |(_, _, r): &(u64, MadSource, Req)| {
                (r.local_ca_guid, r.local_comm_id) == (req.local_ca_guid, req.local_comm_id)
            };
            if self.held_reqs.iter().any(held) {
                // A retransmission of a REQ already waiting.
                self.out.counters.duplicates += 1;
            } else if self.unmatched_hold > 0 {
                let deadline = self.clock.saturating_add(self.unmatched_hold);
                self.held_reqs.push((deadline, from, req));
            } else {
                self.out.counters.no_listener += 1;
                self.reject_unsolicited(from, &req, reject_reason::INVALID_SERVICE_ID);
            }
            return;
        }
        let Ok(id) = self.new_comm_id() else {
            self.reject_unsolicited(from, &req, reject_reason::NO_RESOURCES);
            return;
        };
        let path = &req.primary_path;
        let conn = Conn {
            role: Role::Passive,
            state: ConnState::ReqReceived,
            remote_comm_id: req.local_comm_id,
            remote_ca_guid: req.local_ca_guid,
            dgid: from.sgid,
            local_qpn: 0,
            remote_qpn: req.local_qpn,
            service_id: req.service_id,
            tid: self.tid_high | u64::from(id),
            peer_tid: req.transaction_id,
            peer_response_timeout: req.local_cm_response_timeout,
            max_cm_retries: req.max_cm_retries,
            timewait_ns: self.timewait_for(path.local_ack_timeout),
            last: None,
            timer: None,
            released: false,
        };
        let info = ReqInfo {
            source: from,
            remote_comm_id: req.local_comm_id,
            remote_ca_guid: req.local_ca_guid,
            remote_qpn: req.local_qpn,
            starting_psn: req.starting_psn,
            qp_type,
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            path_mtu: req.path_mtu,
            flow_control: req.end_to_end_flow_control,
            srq: req.srq,
            pkey: req.partition_key,
            remote_gid: path.local_gid,
            local_gid: path.remote_gid,
            flow_label: path.flow_label,
            traffic_class: path.traffic_class,
            hop_limit: path.hop_limit,
            sl: path.sl,
            packet_rate: path.packet_rate,
            local_ack_timeout: path.local_ack_timeout,
            remote_cm_response_timeout: req.local_cm_response_timeout,
            local_cm_response_timeout: req.remote_cm_response_timeout,
            max_cm_retries: req.max_cm_retries,
            private_data: req.private_data.to_vec(),
        };
        self.by_remote
            .insert((req.local_ca_guid, req.local_comm_id), id);
        self.out.event(
            &conn,
            CmEvent::ReqReceived {
                conn: ConnId(id),
                service_id: req.service_id,
                req: Box::new(info),
            },
        );
        self.conns.insert(id, conn);
    }

    fn on_mra(&mut self, now: u64, mra: Mra) {
        let Some(c) = self.conns.get_mut(&mra.remote_comm_id) else {
            return self.unmatched("MRA");
        };
        let next = match (c.state, mra.message_mraed) {
            (ConnState::ReqSent, MessageKind::Req) => ConnState::MraReqReceived,
            (ConnState::RepSent, MessageKind::Rep) if c.remote_comm_id == mra.local_comm_id => {
                ConnState::MraRepReceived
            }
            (ConnState::MraReqReceived | ConnState::MraRepReceived, _) => {
                self.out.counters.duplicates += 1;
                return;
            }
            _ => return self.unmatched("MRA"),
        };
        c.state = next;
        if c.role == Role::Active {
            c.remote_comm_id = mra.local_comm_id;
        }
        // The peer needs its service timeout on top of its response time (IBTA 12.6.6).
        let interval = cm_timeout_ns(mra.service_timeout)
            .saturating_add(cm_timeout_ns(c.peer_response_timeout));
        if let Some(t) = c.timer.as_mut() {
            t.deadline = now.saturating_add(interval);
            t.interval = interval;
        }
        let event = CmEvent::MraReceived {
            conn: ConnId(mra.remote_comm_id),
            service_timeout: mra.service_timeout,
        };
        self.out.event(c, event);
    }

    fn on_rej(&mut self, now: u64, rej: Rej) {
        let id = if rej.remote_comm_id != 0 {
            Some(rej.remote_comm_id)
        } else {
            // A REJ from an active side that never learned our ID (its REQ timed out):
            // find the passive connection by the sender's ID (and the ARI's CA GUID).
            let guid = (rej.reason == reject_reason::TIMEOUT && rej.reject_info_length >= 8)
                .then(|| u64::from_be_bytes(rej.ari[..8].try_into().unwrap_or([0; 8])));
            self.conns
                .iter()
                .find(|(_, c)| {
                    c.role == Role::Passive
                        && c.remote_comm_id == rej.local_comm_id
                        && guid.is_none_or(|g| g == c.remote_ca_guid)
                })
                .map(|(&id, _)| id)
        };
        let Some(c) = id.and_then(|id| self.conns.get_mut(&id)) else {
            return self.unmatched("REJ");
        };
        if c.remote_comm_id != 0 && rej.local_comm_id != 0 && c.remote_comm_id != rej.local_comm_id
        {
            return self.unmatched("REJ");
        }
        let conn = ConnId(id.unwrap_or_default());
        let event = CmEvent::Rejected {
            conn,
            reason: rej.reason,
            ari: rej.ari().to_vec(),
            private_data: rej.private_data.to_vec(),
        };
        // As the kernel's cm_rej_handler: before the REP a REJ ends the attempt (stale
        // connection: through timewait); once the REP is in hand, or established, or
        // disconnecting, the QP may have carried traffic: timewait.
        match c.state {
            ConnState::ReqSent
            | ConnState::MraReqReceived
            | ConnState::RepSent
            | ConnState::MraRepReceived
            | ConnState::ReqReceived
            | ConnState::MraReqSent => {
                c.timer = None;
                c.last = None;
                c.state = ConnState::Idle;
                self.out.event(c, event);
                if rej.reason == reject_reason::STALE_CONNECTION {
                    self.enter_timewait(now, conn.0);
                }
            }
            ConnState::RepReceived
            | ConnState::MraRepSent
            | ConnState::Established
            | ConnState::DreqSent => {
                c.last = None;
                self.out.event(c, event);
                self.enter_timewait(now, conn.0);
            }
            _ => self.unmatched("REJ"),
        }
    }

    fn on_rep(&mut self, rep: Rep) {
        let Some(c) = self.conns.get_mut(&rep.remote_comm_id) else {
            return self.unmatched("REP");
        };
        if c.role != Role::Active {
            return self.unmatched("REP");
        }
        match c.state {
            ConnState::ReqSent | ConnState::MraReqReceived => {
                c.state = ConnState::RepReceived;
                c.timer = None;
                c.last = None;
                c.remote_comm_id = rep.local_comm_id;
                c.remote_ca_guid = rep.local_ca_guid;
                c.remote_qpn = rep.local_qpn;
                c.peer_tid = rep.transaction_id;
                let info = RepInfo {
                    remote_comm_id: rep.local_comm_id,
                    remote_ca_guid: rep.local_ca_guid,
                    remote_qpn: rep.local_qpn,
                    starting_psn: rep.starting_psn,
                    responder_resources: rep.responder_resources,
                    initiator_depth: rep.initiator_depth,
                    target_ack_delay: rep.target_ack_delay,
                    failover_accepted: rep.failover_accepted,
                    flow_control: rep.end_to_end_flow_control,
                    rnr_retry_count: rep.rnr_retry_count,
                    srq: rep.srq,
                    private_data: rep.private_data.to_vec(),
                };
                let event = CmEvent::RepReceived {
                    conn: ConnId(rep.remote_comm_id),
                    rep: Box::new(info),
                };
                self.out.event(c, event);
            }
            _ if c.remote_comm_id != rep.local_comm_id => self.unmatched("REP"),
            ConnState::Established => {
                // Our RTU was lost: send it again (IBTA 12.9.5.1, duplicate REP).
                self.out.counters.duplicates += 1;
                if let Some(bytes) = c.last {
                    self.out.send(c.dgid, bytes);
                }
            }
            ConnState::RepReceived | ConnState::MraRepSent => {
                self.out.counters.duplicates += 1;
                if let (ConnState::MraRepSent, Some(bytes)) = (c.state, c.last) {
                    self.out.send(c.dgid, bytes);
                }
            }
            _ => self.unmatched("REP"),
        }
    }

    fn on_rtu(&mut self, rtu: Rtu) {
        let Some(c) = self.conns.get_mut(&rtu.remote_comm_id) else {
            return self.unmatched("RTU");
        };
        if c.role != Role::Passive || c.remote_comm_id != rtu.local_comm_id {
            return self.unmatched("RTU");
        }
        match c.state {
            ConnState::RepSent | ConnState::MraRepReceived => {
                c.state = ConnState::Established;
                c.timer = None;
                c.last = None;
                let event = CmEvent::RtuReceived {
                    conn: ConnId(rtu.remote_comm_id),
                    private_data: rtu.private_data.to_vec(),
                };
                self.out.event(c, event);
            }
            ConnState::Established => self.out.counters.duplicates += 1,
            _ => self.unmatched("RTU"),
        }
    }

    fn on_dreq(&mut self, from: MadSource, dreq: Dreq) {
        let matching = self.conns.get(&dreq.remote_comm_id).is_some_and(|c| {
            matches!(c.role, Role::Active | Role::Passive) && c.remote_comm_id == dreq.local_comm_id
        });
        if !matching {
            // The kernel answers a DREQ it cannot place with a DREP, so the peer stops
            // retransmitting (cm_issue_drep).
            self.unmatched("DREQ");
            let msg = Drep {
                transaction_id: dreq.transaction_id,
                local_comm_id: dreq.remote_comm_id,
                remote_comm_id: dreq.local_comm_id,
                private_data: [0; mad::DREP_PRIVATE_DATA_LEN],
            };
            self.out.send(from.sgid, encode(|m| msg.write(m)));
            return;
        }
        let Some(c) = self.conns.get_mut(&dreq.remote_comm_id) else {
            return;
        };
        if c.local_qpn != dreq.remote_qpn {
            return self.unmatched("DREQ");
        }
        match c.state {
            ConnState::Established
            | ConnState::RepSent
            | ConnState::MraRepReceived
            | ConnState::DreqSent => {
                // DreqSent: both sides disconnect at once; each answers the other's DREQ.
                c.state = ConnState::DreqReceived;
                c.timer = None;
                c.last = None;
                c.peer_tid = dreq.transaction_id;
                let event = CmEvent::DreqReceived {
                    conn: ConnId(dreq.remote_comm_id),
                    private_data: dreq.private_data.to_vec(),
                };
                self.out.event(c, event);
            }
            ConnState::DreqReceived => self.out.counters.duplicates += 1,
            ConnState::Timewait => {
                // Our DREP was lost: answer again (IBTA 12.9.7).
                self.out.counters.duplicates += 1;
                let msg = Drep {
                    transaction_id: dreq.transaction_id,
                    local_comm_id: dreq.remote_comm_id,
                    remote_comm_id: dreq.local_comm_id,
                    private_data: [0; mad::DREP_PRIVATE_DATA_LEN],
                };
                let bytes = match c.last {
                    Some(b)
                        if mad::AttributeId::from(u16::from_be_bytes([b[16], b[17]]))
                            == mad::AttributeId::Drep =>
                    {
                        b
                    }
                    _ => encode(|m| msg.write(m)),
                };
                self.out.send(c.dgid, bytes);
            }
            _ => self.unmatched("DREQ"),
        }
    }

    fn on_drep(&mut self, now: u64, drep: Drep) {
        let Some(c) = self.conns.get_mut(&drep.remote_comm_id) else {
            return self.unmatched("DREP");
        };
        if c.remote_comm_id != drep.local_comm_id {
            return self.unmatched("DREP");
        }
        match c.state {
            ConnState::DreqSent => {
                let event = CmEvent::DrepReceived {
                    conn: ConnId(drep.remote_comm_id),
                    private_data: drep.private_data.to_vec(),
                };
                self.out.event(c, event);
                self.enter_timewait(now, drep.remote_comm_id);
            }
            ConnState::Timewait => self.out.counters.duplicates += 1,
            _ => self.unmatched("DREP"),
        }
    }

    fn on_sidr_req(&mut self, from: MadSource, req: SidrReq) {
        if let Some(&id) = self.sidr_by_remote.get(&(from.sgid, req.request_id)) {
            self.out.counters.duplicates += 1;
            if let Some(Conn {
                dgid,
                last: Some(bytes),
                ..
            }) = self.conns.get(&id)
            {
                self.out.send(*dgid, *bytes);
            }
            return;
        }
        if !self.listeners.contains(&req.service_id) {
            self.out.counters.no_listener += 1;
            let msg = SidrRep {
                transaction_id: req.transaction_id,
                request_id: req.request_id,
                status: sidr_status::UNSUPPORTED,
                additional_information_length: 0,
                qpn: 0,
                service_id: req.service_id,
                qkey: 0,
                additional_information: [0; mad::SIDR_REP_INFO_LEN],
                private_data: [0; mad::SIDR_REP_PRIVATE_DATA_LEN],
            };
            self.out.send(from.sgid, encode(|m| msg.write(m)));
            return;
        }
        let Ok(id) = self.new_comm_id() else {
            return self.unmatched("SIDR_REQ");
        };
        let conn = Conn {
            role: Role::SidrPassive,
            state: ConnState::SidrReqReceived,
            remote_comm_id: req.request_id,
            remote_ca_guid: 0,
            dgid: from.sgid,
            local_qpn: 0,
            remote_qpn: from.src_qpn,
            service_id: req.service_id,
            tid: self.tid_high | u64::from(id),
            peer_tid: req.transaction_id,
            peer_response_timeout: 0,
            max_cm_retries: 0,
            timewait_ns: 0,
            last: None,
            timer: None,
            released: false,
        };
        self.out.event(
            &conn,
            CmEvent::SidrReqReceived {
                conn: ConnId(id),
                service_id: req.service_id,
                source: from,
                pkey: req.partition_key,
                private_data: req.private_data.to_vec(),
            },
        );
        self.sidr_by_remote.insert((from.sgid, req.request_id), id);
        self.conns.insert(id, conn);
    }

    fn on_sidr_rep(&mut self, rep: SidrRep) {
        let Some(c) = self.conns.get_mut(&rep.request_id) else {
            return self.unmatched("SIDR_REP");
        };
        if c.role != Role::SidrActive || c.state != ConnState::SidrReqSent {
            return self.unmatched("SIDR_REP");
        }
        c.state = ConnState::Idle;
        c.timer = None;
        c.last = None;
        let event = CmEvent::SidrRepReceived {
            conn: ConnId(rep.request_id),
            status: rep.status,
            qpn: rep.qpn,
            qkey: rep.qkey,
            private_data: rep.private_data.to_vec(),
        };
        self.out.event(c, event);
    }
}

/// A REJ with reason 4 (timeout) and our CA GUID in the ARI (IBTA 12.6.7.2; the kernel
/// sends it when an active id is destroyed before the REP).
fn timeout_rej(c: &Conn, id: u32, guid: u64, message_rejected: MessageKind) -> [u8; MAD_LEN] {
    let mut ari = [0u8; mad::REJ_ARI_LEN];
    ari[..8].copy_from_slice(&guid.to_be_bytes());
    let msg = Rej {
        transaction_id: c.peer_tid,
        local_comm_id: id,
        remote_comm_id: c.remote_comm_id,
        message_rejected,
        reject_info_length: 8,
        reason: reject_reason::TIMEOUT,
        ari,
        private_data: [0; mad::REJ_PRIVATE_DATA_LEN],
    };
    encode(|m| msg.write(m))
}
