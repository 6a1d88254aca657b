//! Two `Cm`s wired to each other in memory under a virtual clock (the `Pair` of the
//! quinn-proto tests): every MAD one side emits is delivered to the other unless a filter
//! drops it.

#![allow(dead_code)]

use softverbs_cm::mad::CmMessage;
use softverbs_cm::{Cm, CmConfig, CmEvent, MadSource, OutgoingMad};

pub const GID_A: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 127, 0, 0, 1];
pub const GID_B: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 127, 0, 0, 2];
pub const GUID_A: u64 = 0x0200_00FF_FE00_0001;
pub const GUID_B: u64 = 0x0200_00FF_FE00_0002;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

pub struct Pair {
    pub a: Cm,
    pub b: Cm,
    pub now: u64,
    pub events_a: Vec<CmEvent>,
    pub events_b: Vec<CmEvent>,
    /// Every MAD delivered or dropped, in order: (from, message name, dropped).
    pub log: Vec<(Side, String, bool)>,
}

impl Pair {
    pub fn new(seed: u64) -> Self {
        Self::with_shares(seed, 0, 0)
    }

    /// Two `Cm`s whose communication IDs carry these shares (`CmConfig::share`).
    pub fn with_shares(seed: u64, share_a: u8, share_b: u8) -> Self {
        Self {
            a: Cm::new(CmConfig {
                local_ca_guid: GUID_A,
                seed,
                share: share_a,
            }),
            b: Cm::new(CmConfig {
                local_ca_guid: GUID_B,
                seed: seed.wrapping_add(1),
                share: share_b,
            }),
            now: 1_000,
            events_a: Vec::new(),
            events_b: Vec::new(),
            log: Vec::new(),
        }
    }

    pub fn cm(&mut self, side: Side) -> &mut Cm {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Delivers queued MADs both ways until none is left (bounded), dropping those
    /// `drop` picks. Returns how many MADs moved (delivered or dropped).
    pub fn deliver(&mut self, mut drop: impl FnMut(Side, &OutgoingMad) -> bool) -> usize {
        let mut moved = 0;
        for _ in 0..1000 {
            let mut any = false;
            while let Some(m) = self.a.poll_transmit() {
                any = true;
                moved += 1;
                assert_eq!(m.dest_qpn, 1);
                assert_eq!(m.dgid, GID_B, "A sends to B only");
                let dropped = drop(Side::A, &m);
                self.log.push((Side::A, name(&m), dropped));
                if !dropped {
                    let from = MadSource {
                        sgid: GID_A,
                        src_qpn: 1,
                    };
                    self.b.handle_mad(self.now, from, &m.bytes);
                }
            }
            while let Some(m) = self.b.poll_transmit() {
                any = true;
                moved += 1;
                assert_eq!(m.dgid, GID_A, "B sends to A only");
                let dropped = drop(Side::B, &m);
                self.log.push((Side::B, name(&m), dropped));
                if !dropped {
                    let from = MadSource {
                        sgid: GID_B,
                        src_qpn: 1,
                    };
                    self.a.handle_mad(self.now, from, &m.bytes);
                }
            }
            self.collect();
            if !any {
                return moved;
            }
        }
        panic!("MADs kept flowing after 1000 rounds: livelock");
    }

    pub fn deliver_all(&mut self) -> usize {
        self.deliver(|_, _| false)
    }

    pub fn collect(&mut self) {
        while let Some(e) = self.a.poll_event() {
            self.events_a.push(e);
        }
        while let Some(e) = self.b.poll_event() {
            self.events_b.push(e);
        }
    }

    /// Moves the clock to the earliest timer of either side and runs both sides' timers.
    /// Returns false if no timer runs.
    pub fn advance(&mut self) -> bool {
        let next = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(next) = next else {
            return false;
        };
        assert!(
            next >= self.now,
            "a timer in the past: {next} < {}",
            self.now
        );
        self.now = next;
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
        self.collect();
        true
    }

    pub fn take_events(&mut self, side: Side) -> Vec<CmEvent> {
        match side {
            Side::A => std::mem::take(&mut self.events_a),
            Side::B => std::mem::take(&mut self.events_b),
        }
    }
}

pub fn name(m: &OutgoingMad) -> String {
    CmMessage::parse(&m.bytes)
        .map(|m| m.name().to_string())
        .unwrap_or_else(|e| format!("unparsable: {e}"))
}
