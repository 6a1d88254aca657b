//! End-to-end tests of softverbs across processes and hosts.
//!
//! The binary `softverbs-e2e-peer` runs one side of a verifying RC workload of mixed
//! opcodes (send, send with immediate, RDMA write, RDMA read, fetch-and-add,
//! compare-and-swap) over UDP: the client checks every completion, every byte read back
//! and every atomic's original value; the server checks every received message's length,
//! immediate and bytes, and at the end the atomic words. Any lost, duplicated, reordered
//! or corrupted message fails the run. The tests in `tests/` run it as two processes on
//! 127.0.0.x, as two hosts made of network namespaces joined by a veth pair (with
//! `iptables` dropping packets), with the peer killed mid-run, and with a capture that
//! `tshark` decodes.
//!
//! [`pattern`] is the byte pattern both sides derive from a message's index.

/// Byte `j` of message `i`'s payload.
pub fn pattern(i: u64, j: usize) -> u8 {
    (i.wrapping_mul(31).wrapping_add(j as u64 * 7) % 251) as u8
}

/// The payload length of message `i` (1 to 3000 bytes: up to three 1024-byte MTUs).
pub fn size_of_message(i: u64) -> usize {
    1 + (i.wrapping_mul(7919) % 3000) as usize
}

/// What operation message `i` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// SEND of `size_of_message(i)` bytes.
    Send,
    /// SEND_WITH_IMM of 16 bytes, immediate `i`.
    SendImm,
    /// RDMA WRITE of `size_of_message(i)` bytes to the server's slot for `i`.
    Write,
    /// RDMA READ of what message `i - 1` wrote.
    Read,
    /// FETCH_AND_ADD of `i` on the server's counter word.
    FetchAdd,
    /// COMPARE_AND_SWAP k -> k + 1 on the server's CAS word.
    CompareSwap,
}

/// The operation of message `i`.
pub fn op_of(i: u64) -> Op {
    match i % 6 {
        0 => Op::Send,
        1 => Op::SendImm,
        2 => Op::Write,
        3 => Op::Read,
        4 => Op::FetchAdd,
        _ => Op::CompareSwap,
    }
}

/// The immediate that marks the client's final message (its payload: the message count).
pub const DONE_IMM: u32 = u32::MAX;
