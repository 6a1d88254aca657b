//! A single-producer, single-consumer ring of packets in memory that two processes share.
//!
//! The ring is a header and a data area of `cap` bytes (a power of two) somewhere in a
//! shared mapping. Positions are byte counts that only grow (`u64`, never wrapping in
//! practice); `tail` is written by the producer only, `head` by the consumer only, each in
//! a cache line of its own. A record is 8 header bytes — the packet's length (`u32`), its
//! UDP source port (`u16`) and flags (`u16`) — then the packet, padded to 8 bytes. A record
//! never wraps: where the rest of the area is too short, the producer writes a wrap marker
//! (length `u32::MAX`) and starts again at offset 0. A producer may also keep to the first
//! bytes of the area ([`Ring::producer_within`]: the pages it has allocated so far) by
//! wrapping early; the consumer follows a marker wherever it finds one.
//!
//! Ordering: the producer writes records with plain stores, then publishes them with one
//! `Release` store of `tail`; the consumer's `Acquire` load of `tail` makes them visible.
//! The consumer copies records out, then frees their space with one `Release` store of
//! `head`, which the producer loads with `Acquire` before reusing the space.
//!
//! The other process may be buggy or stop at any instant: every length and position read
//! from the shared memory is checked before it is used, so a bad ring is refused
//! ([`Broken`]), never a read or write outside the area.

use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Bytes of a record's header.
const RECORD_HEADER: usize = 8;

/// The length that marks "the next record is at offset 0".
const WRAP: u32 = u32::MAX;

/// The header of a ring: who holds it, and the two positions.
#[repr(C, align(64))]
pub(crate) struct RingHeader {
    /// [`FREE`], [`CLAIMED`] or [`CLOSING`].
    pub(crate) state: AtomicU32,
    /// The producer's process ID while claimed.
    pub(crate) pid: AtomicU32,
    /// The producer's device address (a GID: IPv4-mapped or IPv6), written before the ring
    /// is marked active.
    pub(crate) from: [AtomicU32; 4],
    /// The bytes of data the producer reserved and produces into (`inbox.rs`: smaller
    /// where `/dev/shm` has little room), written before the ring is marked active; 0 (a
    /// ring no producer sized) for the largest.
    pub(crate) cap: AtomicU32,
    _pad0: [u8; 36],
    /// Bytes ever written (producer).
    pub(crate) tail: AtomicU64,
    /// The consumer's `head` as the producer last read it, kept by the producer for itself
    /// (in its own line: the consumer never reads it), so that it reads the consumer's
    /// line only when this says the ring is full. Never ahead of `head`: it is a value
    /// `head` had (set at claim, `inbox.rs`).
    pub(crate) seen_head: AtomicU64,
    _pad1: [u8; 48],
    /// Bytes ever consumed (consumer).
    pub(crate) head: AtomicU64,
    _pad2: [u8; 56],
}

/// A ring nobody produces into.
pub(crate) const FREE: u32 = 0;
/// A ring a producer holds.
pub(crate) const CLAIMED: u32 = 1;
/// A ring its producer let go of: the consumer frees it once it has taken what is left.
pub(crate) const CLOSING: u32 = 2;

/// The ring's memory is inconsistent (a position or a length no correct producer writes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Broken;

/// A record the consumer took: the packet's length and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) len: usize,
    pub(crate) src_port: u16,
    pub(crate) flags: u16,
}

/// A ring at a fixed place in memory.
///
/// Invariant: `header` points to a [`RingHeader`] and `data` to `cap` bytes, both in a
/// mapping that outlives the `Ring`; `cap` is a power of two, at least 64.
#[derive(Clone, Copy)]
pub(crate) struct Ring {
    header: *const RingHeader,
    data: *mut u8,
    cap: usize,
}

// SAFETY: a `Ring` is two pointers into shared memory accessed only through atomics and
// through copies ordered by them (module documentation); which thread holds it does not
// matter.
unsafe impl Send for Ring {}
// SAFETY: as for `Send`: every access through `&Ring` goes through atomics or through
// copies ordered by them.
unsafe impl Sync for Ring {}

fn padded(len: usize) -> usize {
    RECORD_HEADER + len.next_multiple_of(8)
}

impl Ring {
    /// The ring at `header` with `cap` bytes of data at `data`.
    ///
    /// # Safety
    ///
    /// `header` points to a `RingHeader` and `data` to `cap` bytes (a power of two, at
    /// least 64, 8-aligned), both valid for as long as the `Ring` (and its copies) are used.
    pub(crate) unsafe fn new(header: *const RingHeader, data: *mut u8, cap: usize) -> Ring {
        debug_assert!(cap.is_power_of_two() && cap >= 64);
        Ring { header, data, cap }
    }

    pub(crate) fn header(&self) -> &RingHeader {
        // SAFETY: the invariant of `Ring`.
        unsafe { &*self.header }
    }

    /// Where position `pos` lies in the data area: a mask, `cap` being a power of two (a
    /// `%` by a capacity known only at run time is a division, some 25 cycles, on every
    /// record pushed and taken).
    fn offset(&self, pos: u64) -> usize {
        (pos & (self.cap as u64 - 1)) as usize
    }

    /// The largest packet a record can hold.
    pub(crate) fn max_packet(&self) -> usize {
        (self.cap / 4).min(u32::MAX as usize - 8)
    }

    /// True if a packet of `len` bytes can ever fit in a record.
    pub(crate) fn fits(&self, len: usize) -> bool {
        len <= self.max_packet()
    }

    /// True if nothing is waiting in the ring.
    pub(crate) fn is_empty(&self) -> bool {
        let header = self.header();
        header.tail.load(Ordering::Acquire) == header.head.load(Ordering::Relaxed)
    }

    /// Starts writing records (the producer); nothing is visible before
    /// [`Producer::publish`].
    #[cfg(test)]
    pub(crate) fn producer(&self) -> Producer<'_> {
        self.producer_within(self.cap)
    }

    /// Starts writing records (the producer) into the first `end` bytes of the area only
    /// (all of it if `end` is `cap` or more): a record placed there ends 8 bytes before
    /// `end` at the latest, so that the wrap marker after it lies before `end` too, and
    /// what does not fit starts the next lap. The producer of a ring whose pages are not
    /// all allocated yet writes none it has not. Nothing is visible before
    /// [`Producer::publish`].
    pub(crate) fn producer_within(&self, end: usize) -> Producer<'_> {
        let header = self.header();
        let limit = if end >= self.cap {
            self.cap
        } else {
            (end / 8 * 8).saturating_sub(RECORD_HEADER)
        };
        Producer {
            ring: self,
            tail: header.tail.load(Ordering::Relaxed),
            // Not the consumer's line: a value it had, enough until the ring looks full
            // (`push_with` then looks at `head` itself).
            head: header.seen_head.load(Ordering::Relaxed),
            written: 0,
            limit,
        }
    }

    /// Takes records (the consumer): calls `take` with each record and its bytes, in
    /// order, while it returns true and records are there. Frees what it took with one
    /// store. Returns how many records it took, or [`Broken`] if the ring's memory is
    /// inconsistent (what was taken before is freed).
    pub(crate) fn consume(
        &self,
        mut take: impl FnMut(Record, &[u8]) -> bool,
    ) -> Result<usize, Broken> {
        let header = self.header();
        let start = header.head.load(Ordering::Relaxed);
        let tail = header.tail.load(Ordering::Acquire);
        let mut head = start;
        let mut taken = 0;
        let mut result = Ok(());
        while head != tail {
            if tail.wrapping_sub(head) > self.cap as u64 {
                result = Err(Broken);
                break;
            }
            let offset = self.offset(head);
            let to_end = self.cap - offset;
            // SAFETY: `offset + 8 <= cap` (offsets are multiples of 8 while the ring is
            // consistent, checked below), in the data area of the invariant; published by
            // the Acquire load of `tail`.
            let word = unsafe { ptr::read(self.data.add(offset) as *const u64) };
            let len = word as u32;
            if len == WRAP {
                head += to_end as u64;
                continue;
            }
            let len = len as usize;
            let record = padded(len);
            if len > self.max_packet() || record > to_end || (record as u64) > tail - head {
                result = Err(Broken);
                break;
            }
            let meta = Record {
                len,
                src_port: (word >> 32) as u16,
                flags: (word >> 48) as u16,
            };
            // SAFETY: `offset + 8 + len <= cap` (checked above), published by `tail`.
            let bytes =
                unsafe { std::slice::from_raw_parts(self.data.add(offset + RECORD_HEADER), len) };
            if !take(meta, bytes) {
                break;
            }
            head += record as u64;
            taken += 1;
        }
        if head != start {
            header.head.store(head, Ordering::Release);
        }
        result.map(|()| taken)
    }
}

/// What [`Producer::push_with`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// The record is appended.
    Yes,
    /// No room (or too long, or the ring is inconsistent).
    Full,
    /// The writer refused: nothing appended.
    Refused,
}

/// Records being written into a [`Ring`]; [`Producer::publish`] makes them visible.
pub(crate) struct Producer<'a> {
    ring: &'a Ring,
    tail: u64,
    head: u64,
    written: usize,
    /// Where records end at the latest ([`Ring::producer_within`]): `cap`, or 8 bytes
    /// before the end of what the producer may write.
    limit: usize,
}

impl Producer<'_> {
    /// Appends a packet; false if the ring has no room for it (or the packet is too long
    /// for a record), or if the ring is inconsistent.
    #[cfg(test)]
    pub(crate) fn push(&mut self, src_port: u16, flags: u16, packet: &[u8]) -> bool {
        self.push_with(src_port, flags, packet.len(), |record| {
            record.copy_from_slice(packet);
            true
        }) == Pushed::Yes
    }

    /// Appends a packet of `len` bytes that `write` writes into the record (all of it);
    /// [`Pushed::Full`] if the ring has no room for it (or it is too long for a record, or
    /// the ring is inconsistent), [`Pushed::Refused`] if `write` returned false (nothing
    /// was appended).
    pub(crate) fn push_with(
        &mut self,
        src_port: u16,
        flags: u16,
        len: usize,
        write: impl FnOnce(&mut [u8]) -> bool,
    ) -> Pushed {
        let cap = self.ring.cap;
        let record = padded(len);
        if len > self.ring.max_packet() || record > self.limit {
            return Pushed::Full;
        }
        let used = self.tail.wrapping_sub(self.head);
        if used > cap as u64 {
            return Pushed::Full;
        }
        let mut offset = self.ring.offset(self.tail);
        let to_end = cap - offset;
        // Past the limit: the rest of the lap is skipped (a marker at `offset`, which a
        // record that ended before the limit left there, or 0).
        let wraps = offset + record > self.limit;
        let need = if wraps { to_end + record } else { record };
        if (cap as u64 - used) < need as u64 {
            // Perhaps the consumer took some since: look again once.
            let header = self.ring.header();
            self.head = header.head.load(Ordering::Acquire);
            header.seen_head.store(self.head, Ordering::Relaxed);
            let used = self.tail.wrapping_sub(self.head);
            if used > cap as u64 || (cap as u64 - used) < need as u64 {
                return Pushed::Full;
            }
        }
        if wraps {
            // SAFETY: `offset + 8 <= cap`: offsets are multiples of 8 and `cap` too (and
            // `offset + 8 <= end` where the producer keeps within `end`: the last record
            // ended at `limit = end - 8` at the latest).
            unsafe { ptr::write(self.ring.data.add(offset) as *mut u64, u64::from(WRAP)) };
            self.tail += to_end as u64;
            offset = 0;
        }
        let word = len as u64 | (u64::from(src_port) << 32) | (u64::from(flags) << 48);
        // SAFETY: `offset + record <= cap` (room checked above), in the data area, and not
        // visible to the consumer before `publish` (nor read by it: it stops at `tail`),
        // so this producer's alone.
        let written = unsafe {
            ptr::write(self.ring.data.add(offset) as *mut u64, word);
            write(std::slice::from_raw_parts_mut(
                self.ring.data.add(offset + RECORD_HEADER),
                len,
            ))
        };
        if !written {
            return Pushed::Refused;
        }
        self.tail += record as u64;
        self.written += 1;
        Pushed::Yes
    }

    /// Makes every record pushed so far visible to the consumer; returns how many. More
    /// can be pushed (and published) after.
    pub(crate) fn publish(&mut self) -> usize {
        let written = std::mem::take(&mut self.written);
        if written > 0 {
            self.ring.header().tail.store(self.tail, Ordering::Release);
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A ring in heap memory (8-aligned), as it would be in a shared mapping.
    struct HeapRing {
        header: Box<RingHeader>,
        data: Vec<u64>,
    }

    impl HeapRing {
        fn new(cap: usize) -> HeapRing {
            HeapRing {
                // SAFETY: all-zero bytes are a valid `RingHeader` (atomics and byte arrays).
                header: Box::new(unsafe { std::mem::zeroed() }),
                data: vec![0; cap / 8],
            }
        }

        fn ring(&mut self) -> Ring {
            let cap = self.data.len() * 8;
            // SAFETY: the header and `cap` 8-aligned bytes live as long as `self`, which
            // every test keeps beyond the ring's last use.
            unsafe { Ring::new(&*self.header, self.data.as_mut_ptr() as *mut u8, cap) }
        }
    }

    fn packet(seq: u32, len: usize) -> Vec<u8> {
        (0..len).map(|i| (seq as usize * 7 + i) as u8).collect()
    }

    #[test]
    fn records_come_out_in_order_with_their_port_and_flags_across_the_wrap() {
        let mut heap = HeapRing::new(256);
        let ring = heap.ring();
        let mut expected = std::collections::VecDeque::new();
        let mut seq = 0u32;
        for round in 0..50 {
            let mut producer = ring.producer();
            for _ in 0..3 {
                let len = 16 + (seq as usize * 4) % 44;
                if producer.push(seq as u16, round, &packet(seq, len)) {
                    expected.push_back((seq, len, round));
                    seq += 1;
                }
            }
            producer.publish();
            ring.consume(|record, bytes| {
                let (s, len, flags) = expected.pop_front().expect("a record was written");
                assert_eq!(record.len, len);
                assert_eq!(record.src_port, s as u16);
                assert_eq!(record.flags, flags);
                assert_eq!(bytes, &packet(s, len)[..]);
                true
            })
            .unwrap();
        }
        assert!(expected.is_empty());
        assert!(seq > 100, "the ring wrapped many times ({seq} records)");
    }

    /// A producer that keeps within the first `end` bytes (its allocated pages) never
    /// writes a byte at or past `end`, wrap markers included, and the consumer, which
    /// follows the markers, takes every record in order; once the producer may use the
    /// whole area, records go past `end` and still come out in order.
    #[test]
    fn a_producer_within_its_first_bytes_writes_nothing_past_them() {
        const UNTOUCHED: u64 = 0xa5a5_a5a5_a5a5_a5a5;
        let mut heap = HeapRing::new(1024);
        heap.data.fill(UNTOUCHED);
        let ring = heap.ring();
        let end = 200;
        let mut expected = std::collections::VecDeque::new();
        let mut seq = 0u32;
        let take = |expected: &mut std::collections::VecDeque<(u32, usize)>| {
            ring.consume(|record, bytes| {
                let (s, len) = expected.pop_front().expect("a record was written");
                assert_eq!((record.len, record.src_port), (len, s as u16));
                assert_eq!(bytes, &packet(s, len)[..]);
                true
            })
            .unwrap()
        };
        for _ in 0..100 {
            let mut producer = ring.producer_within(end);
            for _ in 0..2 {
                let len = 16 + (seq as usize * 12) % 60;
                if producer.push(seq as u16, 0, &packet(seq, len)) {
                    expected.push_back((seq, len));
                    seq += 1;
                }
            }
            producer.publish();
            take(&mut expected);
        }
        assert!(seq > 150, "the producer wrapped many times ({seq} records)");
        // SAFETY: the ring's data area: `data` holds 1024 bytes.
        let past_end = unsafe {
            std::slice::from_raw_parts(heap.data.as_ptr().cast::<u8>().add(end), 1024 - end)
        };
        assert!(
            past_end.iter().all(|&byte| byte == 0xa5),
            "a byte past the producer's end was written"
        );
        assert!(
            !ring.producer_within(end).push(0, 0, &[0; 200]),
            "a record longer than the bytes the producer keeps within is refused"
        );
        // The whole area now: the next laps use it.
        for _ in 0..100 {
            let mut producer = ring.producer_within(1024);
            let len = 16 + (seq as usize * 12) % 60;
            assert!(producer.push(seq as u16, 0, &packet(seq, len)));
            expected.push_back((seq, len));
            seq += 1;
            producer.publish();
            take(&mut expected);
        }
        assert!(expected.is_empty());
        // SAFETY: as above.
        let past_end = unsafe {
            std::slice::from_raw_parts(heap.data.as_ptr().cast::<u8>().add(end), 1024 - end)
        };
        assert!(
            past_end.iter().any(|&byte| byte != 0xa5),
            "the area past `end` was used"
        );
    }

    #[test]
    fn a_full_ring_refuses_and_nothing_is_visible_before_publish() {
        let mut heap = HeapRing::new(128);
        let ring = heap.ring();
        let mut producer = ring.producer();
        assert!(producer.push(1, 0, &[1; 32]));
        assert!(producer.push(2, 0, &[2; 32]));
        assert!(producer.push(3, 0, &[3; 32]));
        assert!(
            !producer.push(4, 0, &[4; 32]),
            "128 bytes hold three 40-byte records"
        );
        assert!(ring.is_empty(), "not published yet");
        assert_eq!(producer.publish(), 3);
        assert_eq!(ring.consume(|_, _| true), Ok(3));
        assert!(ring.is_empty());
        assert!(!ring.producer().push(0, 0, &[0; 33]), "longer than cap / 4");
    }

    #[test]
    fn an_inconsistent_ring_is_refused_not_read_outside_its_area() {
        let mut heap = HeapRing::new(128);
        let ring = heap.ring();
        // A tail a whole ring and more ahead of the head.
        ring.header().tail.store(129, Ordering::Release);
        assert_eq!(ring.consume(|_, _| true), Err(Broken));
        // A record longer than what is published, and one past the end of the area.
        ring.header().tail.store(16, Ordering::Release);
        heap.data[0] = 100;
        let ring = heap.ring();
        assert_eq!(ring.consume(|_, _| true), Err(Broken));
        heap.data[0] = 1000;
        let ring = heap.ring();
        ring.header().tail.store(128, Ordering::Release);
        assert_eq!(ring.consume(|_, _| true), Err(Broken));
    }

    // The two sides in two threads: every record arrives once, intact and in order. Under
    // Miri this checks that the Release/Acquire pairs order the plain copies (a data race
    // is an error there).
    #[test]
    fn producer_and_consumer_in_two_threads_see_every_record_intact() {
        let count: u32 = if cfg!(miri) { 60 } else { 20_000 };
        let mut heap = HeapRing::new(256);
        let ring = heap.ring();
        let done = Arc::new(AtomicU32::new(0));
        std::thread::scope(|scope| {
            let producer_done = done.clone();
            scope.spawn(move || {
                let mut seq = 0;
                while seq < count {
                    let mut producer = ring.producer();
                    while seq < count
                        && producer.push(seq as u16, 0, &packet(seq, 16 + (seq as usize % 5) * 8))
                    {
                        seq += 1;
                    }
                    producer.publish();
                    std::thread::yield_now();
                }
                producer_done.store(1, Ordering::Release);
            });
            let mut next = 0u32;
            while next < count {
                ring.consume(|record, bytes| {
                    assert_eq!(record.src_port, next as u16);
                    assert_eq!(bytes, &packet(next, 16 + (next as usize % 5) * 8)[..]);
                    next += 1;
                    true
                })
                .unwrap();
                std::thread::yield_now();
            }
        });
        assert_eq!(done.load(Ordering::Acquire), 1);
        drop(heap);
    }

    /// The producer keeps its own copy of the consumer's head and reads the consumer's
    /// cache line only when that copy says the ring is full: a busy pair moves the line of
    /// `tail` and the records, not also the line of `head`, for each packet.
    #[test]
    fn the_producer_reads_the_consumers_head_only_when_the_ring_looks_full() {
        let mut heap = HeapRing::new(256);
        let ring = heap.ring();
        let header = ring.header();
        let taken = |ring: &Ring| ring.consume(|_, _| true).unwrap();
        // 3 records of 64 bytes (8 + 56): room for 4 in 256 bytes.
        for round in 0..3u32 {
            let mut producer = ring.producer();
            assert!(producer.push(0, 0, &packet(round, 56)));
            producer.publish();
            assert_eq!(taken(&ring), 1);
        }
        assert_eq!(header.head.load(Ordering::Relaxed), 192);
        assert_eq!(
            header.seen_head.load(Ordering::Relaxed),
            0,
            "room enough: head not read"
        );
        // The fourth fits against the stale copy too; the fifth does not, and the producer
        // then looks at the consumer's head, finds the room and keeps what it saw.
        let mut producer = ring.producer();
        assert!(producer.push(0, 0, &packet(3, 56)));
        assert_eq!(header.seen_head.load(Ordering::Relaxed), 0);
        assert!(producer.push(0, 0, &packet(4, 56)));
        producer.publish();
        assert_eq!(header.seen_head.load(Ordering::Relaxed), 192);
        assert_eq!(taken(&ring), 2);
    }
}
