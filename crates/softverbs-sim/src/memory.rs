//! [`SimMemory`]: in-memory registered regions implementing the engine's [`Memory`] trait,
//! with exact key, protection-domain, bounds and access checks (a failed check touches
//! nothing). Regions registered with [`SimMemory::register`] are in protection domain 0,
//! the PD of QPs whose [`QpParams`](crate::QpParams) do not name one;
//! [`SimMemory::register_in`] names the PD.

use softverbs_proto::{AccessFlags, AtomicOp, MemError, MemKey, Memory};

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

    fn find(&self, key: MemKey) -> Result<usize, MemError> {
        self.regions
            .iter()
            .position(|r| {
                r.valid
                    && match key {
                        MemKey::Local(k) => r.lkey == k,
                        MemKey::Remote(k) => r.rkey == k,
                    }
            })
            .ok_or(MemError::InvalidKey)
    }

    fn check(
        &self,
        pd: u32,
        key: MemKey,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<usize, MemError> {
        let i = self.find(key)?;
        let r = &self.regions[i];
        if r.pd != pd {
            return Err(MemError::PdMismatch);
        }
        let end = addr.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if addr < r.addr || end > r.addr + r.data.len() as u64 {
            return Err(MemError::OutOfBounds);
        }
        if !r.access.contains(need) {
            return Err(MemError::AccessDenied);
        }
        Ok(i)
    }
}

impl Memory for SimMemory {
    fn check_local(
        &self,
        pd: u32,
        lkey: u32,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(), MemError> {
        self.check(pd, MemKey::Local(lkey), addr, len, need)
            .map(|_| ())
    }

    fn check_remote(
        &self,
        pd: u32,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(), MemError> {
        self.check(pd, MemKey::Remote(rkey), va, len, need)
            .map(|_| ())
    }

    fn read(&self, pd: u32, key: MemKey, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        if buf.is_empty() {
            return Ok(());
        }
        let need = match key {
            MemKey::Local(_) => AccessFlags::empty(),
            MemKey::Remote(_) => AccessFlags::REMOTE_READ,
        };
        let i = self.check(pd, key, addr, buf.len() as u64, need)?;
        let r = &self.regions[i];
        let at = (addr - r.addr) as usize;
        buf.copy_from_slice(&r.data[at..at + buf.len()]);
        Ok(())
    }

    fn write(&mut self, pd: u32, key: MemKey, addr: u64, data: &[u8]) -> Result<(), MemError> {
        if data.is_empty() {
            return Ok(());
        }
        let need = match key {
            MemKey::Local(_) => AccessFlags::LOCAL_WRITE,
            MemKey::Remote(_) => AccessFlags::REMOTE_WRITE,
        };
        let i = self.check(pd, key, addr, data.len() as u64, need)?;
        let r = &mut self.regions[i];
        let at = (addr - r.addr) as usize;
        r.data[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn atomic(&mut self, pd: u32, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError> {
        if !va.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        let i = self.check(pd, MemKey::Remote(rkey), va, 8, AccessFlags::REMOTE_ATOMIC)?;
        let r = &mut self.regions[i];
        let at = (va - r.addr) as usize;
        let word: [u8; 8] = r.data[at..at + 8]
            .try_into()
            .map_err(|_| MemError::OutOfBounds)?;
        let orig = u64::from_ne_bytes(word);
        let new = match op {
            AtomicOp::CompareSwap { compare, swap } => {
                if orig == compare {
                    swap
                } else {
                    orig
                }
            }
            AtomicOp::FetchAdd { add } => orig.wrapping_add(add),
        };
        r.data[at..at + 8].copy_from_slice(&new.to_ne_bytes());
        Ok(orig)
    }

    fn invalidate(&mut self, pd: u32, rkey: u32) -> Result<(), MemError> {
        let i = self.find(MemKey::Remote(rkey))?;
        if self.regions[i].pd != pd {
            return Err(MemError::PdMismatch);
        }
        self.regions[i].valid = false;
        Ok(())
    }
}
