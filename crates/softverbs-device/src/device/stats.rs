//! What a device did, in one structure ([`DeviceStats`]: the engine's counters, the
//! transport's, the faults injected by kind, the CQs' high-water marks and overruns, the
//! asynchronous events, memory faults, the capture), and the `SOFTVERBS_STATS` report
//! ([`STATS_ENV`]) that prints it as one line.
//!
//! Both front doors print the same line through [`Device::report_stats`]: the drop-in when
//! a program closes its context (or, if it never does, at exit); the safe API, and so the
//! `softverbs` command, when the device is dropped. A device reports at drop only if no
//! report was written for it before ([`Device::report_stats_once`]).
//!
//! Reading the statistics takes the device's locks (state, events, fault layer) once each;
//! nothing here is on the post, poll or per-packet path.

use super::{lock, Device};
use crate::events::EventCounts;
use crate::fault::FaultCounters;
use crate::transport::{Sharing, TransportCounters};
use softverbs_cq::CqStats;
use softverbs_proto::Counters;
use std::fmt;
use std::io::Write;
use std::sync::atomic::Ordering;

/// The environment variable naming where a device's statistics line goes when the
/// device is closed: `stderr` (or `-`), or a file the line is appended to. Unset: nothing
/// is written.
pub const STATS_ENV: &str = "SOFTVERBS_STATS";

/// The completion queues a device's QPs complete into, summed: which one filled most, and
/// what was lost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqSummary {
    /// CQs the device completed into (live and destroyed).
    pub cqs: u64,
    /// The most completions ever waiting at once in one CQ.
    pub high_water: u64,
    /// The size (`cqe`) of the CQ that reached [`CqSummary::high_water`]: a mark equal to
    /// it means that CQ was full.
    pub high_water_capacity: u32,
    /// Completions lost to overrun, over all CQs (`IBV_EVENT_CQ_ERR`).
    pub overruns: u64,
    /// Completions held back by a full back-pressure CQ, over all CQs.
    pub refused: u64,
    /// CQs in the error state (after an overrun) when they were last seen.
    pub in_error: u64,
}

impl CqSummary {
    /// Adds one CQ's figures.
    pub fn add(&mut self, cq: &CqStats) {
        self.cqs += 1;
        if cq.high_water > self.high_water || self.cqs == 1 {
            self.high_water = cq.high_water;
            self.high_water_capacity = cq.capacity;
        }
        self.overruns += cq.overruns;
        self.refused += cq.refused;
        self.in_error += u64::from(cq.in_error);
    }
}

/// `cqs=N high_water=H/CAPACITY overruns=N refused=N in_error=N`.
impl fmt::Display for CqSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cqs={} high_water={}/{} overruns={} refused={} in_error={}",
            self.cqs,
            self.high_water,
            self.high_water_capacity,
            self.overruns,
            self.refused,
            self.in_error
        )
    }
}

/// What a pcap capture wrote (see [`Capture`](crate::pcap::Capture)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureCounts {
    /// Packets written.
    pub packets: u64,
    /// Bytes of the file, headers included.
    pub bytes: u64,
    /// Packets left out because the file reached `SOFTVERBS_PCAP_LIMIT`.
    pub over_limit: u64,
    /// Records that could not be written.
    pub write_errors: u64,
}

/// `packets=N bytes=N over_limit=N write_errors=N`.
impl fmt::Display for CaptureCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "packets={} bytes={} over_limit={} write_errors={}",
            self.packets, self.bytes, self.over_limit, self.write_errors
        )
    }
}

/// Everything a device counts, at one moment: what a user needs to explain a run
/// (retransmissions and their causes, drops by reason at the engine and at the transport,
/// the faults injected by kind, how full the CQs got, the events raised).
///
/// Each part is read under its own lock, so the parts are consistent each with itself, not
/// with each other while traffic flows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// The queue-pair engine: packets, retransmissions, timeouts, ACKs, NAKs, RNR NAKs,
    /// duplicates, drops by reason.
    pub engine: Counters,
    /// The transport (`None` in-process): datagrams sent and received, the system calls
    /// that carried them, drops by reason (bad ICRC, malformed, truncated,
    /// undeliverable, and the socket's own overflow), and what segmentation offload did
    /// (super-datagrams sent, packets received coalesced).
    pub transport: Option<TransportCounters>,
    /// Fault injection (`None` without `SOFTVERBS_FAULTS`): the packets it saw and what it
    /// did to them, by kind.
    pub faults: Option<FaultCounters>,
    /// The CQs the device's QPs complete into.
    pub cq: CqSummary,
    /// Asynchronous events raised, by kind.
    pub events: EventCounts,
    /// Accesses to registered memory that faulted (unmapped under a registration).
    pub faulted_accesses: u64,
    /// Payload bytes the device wrote into its regions straight from the registered
    /// region of a sender of this process (one copy between devices of a process).
    pub direct_payload_bytes: u64,
    /// Times the progress thread sent ACKs alone — of packets it received while the
    /// application was not polling, or held for the application's next post that did not
    /// come within 100 µs: send calls that a busy-polling ping-pong, whose ACKs leave with
    /// its replies, does not make.
    pub progress_ack_sends: u64,
    /// Times the progress thread slept while the application polled the device itself
    /// (each wake-up takes the CPU from a polling thread for a moment): one per sixteenth
    /// of the shortest local ACK timeout of the device's QPs, between one per 5 ms and one
    /// per millisecond of polling.
    pub progress_naps: u64,
    /// Packets the progress thread received, of the transport's `received_packets`: the
    /// rest were received by application threads, polling or waiting for a completion
    /// event (a packet received by the thread that waits for it wakes no other thread).
    pub progress_received: u64,
    /// The pcap capture (`None` without one).
    pub capture: Option<CaptureCounts>,
}

/// One line of `section: name=value …` parts separated by `; `: `engine`, `transport`,
/// `faults`, `cq`, `events`, `memory`, `acks`, `progress`, `capture` (the optional ones
/// only when present).
impl fmt::Display for DeviceStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "engine: {}", self.engine)?;
        if let Some(t) = &self.transport {
            write!(
                f,
                "; transport: sent_packets={} sent_bytes={} send_errors={} send_calls={} \
                 received_packets={} received_bytes={} recv_calls={} dropped_bad_icrc={} \
                 dropped_malformed={} dropped_truncated={} dropped_undeliverable={} \
                 socket_drops={} icrc_unchecked={} gso_sends={} gro_segments={} gro_in_place_packets={} \
                 shm_sent_packets={} shm_received_packets={} shm_direct_bytes={} \
                 shm_in_place_packets={} shm_stalls={}",
                t.sent_packets,
                t.sent_bytes,
                t.send_errors,
                t.send_calls,
                t.received_packets,
                t.received_bytes,
                t.recv_calls,
                t.dropped_bad_icrc,
                t.dropped_malformed,
                t.dropped_truncated,
                t.dropped_undeliverable,
                t.socket_drops,
                t.icrc_unchecked,
                t.gso_sends,
                t.gro_segments,
                t.gro_in_place_packets,
                t.shm_sent_packets,
                t.shm_received_packets,
                t.shm_direct_bytes,
                t.shm_in_place_packets,
                t.shm_stalls
            )?;
        }
        if let Some(faults) = &self.faults {
            write!(f, "; faults: {faults}")?;
        }
        write!(
            f,
            "; cq: {}; events: {}; memory: faulted_accesses={} direct_payload_bytes={}; \
             acks: progress_ack_sends={}; progress: naps={} received={}",
            self.cq,
            self.events,
            self.faulted_accesses,
            self.direct_payload_bytes,
            self.progress_ack_sends,
            self.progress_naps,
            self.progress_received
        )?;
        if let Some(capture) = &self.capture {
            write!(f, "; capture: {capture}")?;
        }
        Ok(())
    }
}

impl DeviceStats {
    /// Whether `other` says the device did what these figures say: equal in everything but
    /// the receive calls, which the progress thread makes while the device idles (a
    /// timed wake-up finds nothing), and its naps, so both go on after the program is done
    /// with it.
    pub fn same_activity(&self, other: &DeviceStats) -> bool {
        self.without_idle_polling() == other.without_idle_polling()
    }

    /// These figures with the receive calls and the progress thread's naps left out.
    fn without_idle_polling(&self) -> DeviceStats {
        let mut stats = self.clone();
        if let Some(transport) = &mut stats.transport {
            transport.recv_calls = 0;
        }
        stats.progress_naps = 0;
        stats
    }
}

impl Device {
    /// Everything the device counts, now.
    pub fn stats(&self) -> DeviceStats {
        let inner = &self.inner;
        let (engine, (faulted_accesses, direct_payload_bytes), cq) = {
            let st = lock(&inner.state);
            let mut cq = st.retired_cqs;
            for producer in st.cqs.values() {
                cq.add(&producer.stats());
            }
            (
                st.engine.counters().clone(),
                (
                    st.memory.faulted_accesses(),
                    st.memory.direct_payload_bytes(),
                ),
                cq,
            )
        };
        DeviceStats {
            engine,
            transport: self.transport_counters(),
            faults: inner.fault_layer.as_ref().map(|f| f.fault_counters()),
            cq,
            events: inner.events.counts(),
            faulted_accesses,
            direct_payload_bytes,
            progress_ack_sends: inner.progress_ack_sends.load(Ordering::Relaxed),
            progress_naps: inner.progress_naps.load(Ordering::Relaxed),
            progress_received: inner.progress_received.load(Ordering::Relaxed),
            capture: inner.capture.as_ref().map(|c| CaptureCounts {
                packets: c.packets(),
                bytes: c.bytes(),
                over_limit: c.over_limit(),
                write_errors: c.write_errors(),
            }),
        }
    }

    /// The statistics line: `softverbs stats: device NAME address ADDR pid PID: STATS`.
    pub fn stats_line(&self) -> String {
        self.line_of(&self.stats().to_string())
    }

    /// The statistics line with the figures `stats`; an address shared with devices of
    /// other processes says so, and how this device holds it ([`Sharing`]).
    fn line_of(&self, stats: &str) -> String {
        let sharing = match self.sharing() {
            Some(sharing) if sharing.is_shared() => format!(" ({sharing})"),
            _ => String::new(),
        };
        format!(
            "softverbs stats: device {} address {}{sharing} pid {}: {stats}",
            self.name(),
            self.address(),
            std::process::id(),
        )
    }

    /// How this device uses its address when devices of several processes of this host
    /// share it (`None`: in-process, or an address only this device can have).
    pub fn sharing(&self) -> Option<Sharing> {
        self.inner.transport.as_ref().and_then(|t| t.sharing())
    }

    /// Reports the device's statistics: the line of [`Device::stats_line`] where
    /// [`STATS_ENV`] says (nothing when it is unset), and an INFO event with the same
    /// figures. A line that cannot be written is said on stderr, once per report.
    pub fn report_stats(&self) {
        self.report(self.stats());
    }

    /// Reports `stats` (the figures of [`Device::stats`]) and remembers them as the last
    /// report.
    fn report(&self, figures: DeviceStats) {
        let stats = figures.to_string();
        tracing::info!(
            device = self.name(),
            address = %self.address(),
            stats = %stats,
            "device statistics"
        );
        let line = format!("{}\n", self.line_of(&stats));
        *lock(&self.inner.last_report) = Some(figures);
        let Some(target) = std::env::var_os(STATS_ENV) else {
            return;
        };
        let written = if target == "stderr" || target == "-" {
            std::io::stderr().write_all(line.as_bytes())
        } else {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&target)
                .and_then(|mut file| file.write_all(line.as_bytes()))
        };
        if let Err(e) = written {
            eprintln!(
                "softverbs: cannot write the {STATS_ENV} report to {}: {e}",
                target.to_string_lossy()
            );
        }
    }

    /// [`Device::report_stats`], unless the last report made for this device already said
    /// the same ([`DeviceStats::same_activity`]): what a device does when it is dropped,
    /// and the drop-in at exit. A program that closes a context and goes on with the device
    /// (a middleware that probes the device, closes it and opens it again, or never closes
    /// the context it sends on) gets a last line with what happened after that close; one
    /// that ends with its close gets no second line, even though the progress thread went
    /// on polling in between.
    pub fn report_stats_once(&self) {
        let stats = self.stats();
        let reported = lock(&self.inner.last_report)
            .as_ref()
            .is_some_and(|last| last.same_activity(&stats));
        if !reported {
            self.report(stats);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_transport(transport: TransportCounters) -> DeviceStats {
        DeviceStats {
            transport: Some(transport),
            ..DeviceStats::default()
        }
    }

    #[test]
    fn receive_calls_of_an_idle_device_are_not_new_activity() {
        // The drop-in's exit report follows an ibv_close_device only if the device did
        // something since: the progress thread's empty receives are not something.
        let before = with_transport(TransportCounters {
            recv_calls: 2,
            ..TransportCounters::default()
        });
        let polled = with_transport(TransportCounters {
            recv_calls: 3,
            ..TransportCounters::default()
        });
        assert!(before.same_activity(&polled));
        let received = with_transport(TransportCounters {
            recv_calls: 3,
            received_packets: 1,
            received_bytes: 64,
            ..TransportCounters::default()
        });
        assert!(!before.same_activity(&received));
        let mut engine = before.clone();
        engine.engine.packets_sent = 1;
        assert!(!before.same_activity(&engine));
    }
}
