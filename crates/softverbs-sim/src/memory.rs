//! [`SimMemory`]: in-memory registered regions implementing the engine's [`Memory`] trait,
//! with exact key, protection-domain, bounds and access checks (a failed check touches
//! nothing). Regions registered with [`SimMemory::register`] are in protection domain 0,
//! the PD of QPs whose [`QpParams`](crate::QpParams) do not name one;
//! [`SimMemory::register_in`] names the PD.

use softverbs_proto::{atomic_result, AccessFlags, AtomicOp, MemError, MemKey, Memory, RegionInfo};

/// One registered region.
#[derive(Clone, Debug)]
pub struct Region {
    /// First virtual address.
    pub addr: u64,
    /// Contents.
    pub data: Vec<u8>,
    /// L_Key.
    pub lkey: u32,
    /// R_Key.
    pub rkey: u32,
    /// Access rights granted at registration.
    pub access: AccessFlags,
    /// The protection domain it belongs to.
    pub pd: u32,
    /// Not invalidated / deregistered.
    pub valid: bool,
}

/// What [`SimMemory::register`] hands back (the fields of `struct ibv_mr` that matter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mr {
    /// First virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// L_Key.
    pub lkey: u32,
    /// R_Key.
    pub rkey: u32,
    /// The protection domain it belongs to.
    pub pd: u32,
}

/// The registered memory of one simulated node.
#[derive(Clone, Debug, Default)]
pub struct SimMemory {
    regions: Vec<Region>,
    next_key: u32,
    next_addr: u64,
}

impl SimMemory {
    /// Empty memory.
    pub fn new() -> Self {
        SimMemory {
            regions: Vec::new(),
            next_key: 0x100,
            next_addr: 0x1000_0000,
        }
    }

    /// Registers a zeroed region of `len` bytes with `access` in protection domain 0.
    pub fn register(&mut self, len: usize, access: AccessFlags) -> Mr {
        self.register_in(0, len, access)
    }

    /// Registers a zeroed region of `len` bytes with `access` in protection domain `pd`.
    pub fn register_in(&mut self, pd: u32, len: usize, access: AccessFlags) -> Mr {
        let addr = self.next_addr;
        // Leave a gap so off-by-one accesses never land in a neighbour.
        self.next_addr += (len as u64).div_ceil(4096) * 4096 + 4096;
        let lkey = self.next_key;
        let rkey = self.next_key + 1;
        self.next_key += 2;
        self.regions.push(Region {
            addr,
            data: vec![0; len],
            lkey,
            rkey,
            access,
            pd,
            valid: true,
        });
        Mr {
            addr,
            len: len as u64,
            lkey,
            rkey,
            pd,
        }
    }

    /// Deregisters (invalidates) the region with L_Key `lkey`.
    pub fn deregister(&mut self, lkey: u32) {
        if let Some(r) = self.regions.iter_mut().find(|r| r.lkey == lkey) {
            r.valid = false;
        }
    }

    /// Bytes at `[addr, addr + len)` of whichever region holds them (test inspection).
    pub fn bytes(&self, addr: u64, len: usize) -> &[u8] {
        let r = self
            .regions
            .iter()
            .find(|r| addr >= r.addr && addr + len as u64 <= r.addr + r.data.len() as u64)
            .expect("address inside a region");
        let at = (addr - r.addr) as usize;
        &r.data[at..at + len]
    }

    /// Overwrites bytes at `addr` (test setup).
    pub fn fill(&mut self, addr: u64, data: &[u8]) {
        let r = self
            .regions
            .iter_mut()
            .find(|r| addr >= r.addr && addr + data.len() as u64 <= r.addr + r.data.len() as u64)
            .expect("address inside a region");
        let at = (addr - r.addr) as usize;
        r.data[at..at + data.len()].copy_from_slice(data);
    }
}

/// The rule (key, PD, access, bounds; zero length) is the trait's provided methods; the
/// simulator finds the region of a key and copies.
impl Memory for SimMemory {
    /// The index of the region.
    type Handle = usize;

    fn lookup(&self, key: MemKey) -> Result<(usize, RegionInfo), MemError> {
        let i = self
            .regions
            .iter()
            .position(|r| r.valid && key.names(r.lkey, r.rkey))
            .ok_or(MemError::InvalidKey)?;
        let r = &self.regions[i];
        Ok((
            i,
            RegionInfo::new(r.pd, r.addr, r.data.len() as u64, r.access),
        ))
    }

    fn read_region(&self, i: usize, at: usize, buf: &mut [u8]) -> Result<(), MemError> {
        buf.copy_from_slice(&self.regions[i].data[at..at + buf.len()]);
        Ok(())
    }

    fn write_region(&mut self, i: usize, at: usize, data: &[u8]) -> Result<(), MemError> {
        self.regions[i].data[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn atomic_region(&mut self, i: usize, at: usize, op: AtomicOp) -> Result<u64, MemError> {
        let word = &mut self.regions[i].data[at..at + 8];
        let orig = u64::from_ne_bytes(word.try_into().map_err(|_| MemError::OutOfBounds)?);
        word.copy_from_slice(&atomic_result(orig, op).to_ne_bytes());
        Ok(orig)
    }

    fn invalidate_region(&mut self, i: usize) -> Result<(), MemError> {
        self.regions[i].valid = false;
        Ok(())
    }
}
