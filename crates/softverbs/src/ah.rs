//! Address handles (`ibv_create_ah(3)`): where a UD send goes.

use crate::error::Error;
use crate::pd::Pd;
use softverbs_device::Gid;
use softverbs_proto::AddressVector;
use std::sync::Arc;

/// What an address handle points at (`struct ibv_ah_attr` on RoCEv2: always global).
///
/// ```
/// use softverbs::{AhAttr, Gid};
/// let attr = AhAttr::new(Gid::from_ip("127.0.0.2".parse().unwrap())).hop_limit(8);
/// assert_eq!(attr.hop_limit, 8);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AhAttr {
    /// Destination GID (an IP address).
    pub gid: Gid,
    /// Local port (only 1).
    pub port: u8,
    /// Local GID index (only 0).
    pub sgid_index: u8,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
    /// IP traffic class.
    pub traffic_class: u8,
    /// IPv6 flow label.
    pub flow_label: u32,
    /// Service level.
    pub sl: u8,
}

impl AhAttr {
    /// To `gid` through port 1, GID index 0, hop limit 64.
    pub fn new(gid: Gid) -> Self {
        AhAttr {
            gid,
            port: 1,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            sl: 0,
        }
    }

    /// Sets the hop limit.
    pub fn hop_limit(mut self, hop_limit: u8) -> Self {
        self.hop_limit = hop_limit;
        self
    }

    /// Sets the traffic class.
    pub fn traffic_class(mut self, traffic_class: u8) -> Self {
        self.traffic_class = traffic_class;
        self
    }

    /// The address vector, unchecked: the device checks it where it enters (an address
    /// handle, a QP's path).
    pub(crate) fn address_vector(&self) -> AddressVector {
        AddressVector {
            dgid: self.gid.0,
            sgid_index: self.sgid_index,
            hop_limit: self.hop_limit,
            traffic_class: self.traffic_class,
            flow_label: self.flow_label & 0xf_ffff,
            sl: self.sl,
            port_num: self.port,
            is_global: true,
        }
    }
}

/// An address handle (`struct ibv_ah`), named by UD sends
/// ([`SendRequest::to`](crate::SendRequest::to)).
///
/// ```
/// use softverbs::{AhAttr, Context, DeviceConfig};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let pd = ctx.alloc_pd();
/// let ah = pd.create_ah(&AhAttr::new(ctx.gid(0).unwrap()))?;
/// assert_eq!(ah.gid(), ctx.gid(0).unwrap());
/// let mut bad = AhAttr::new(ctx.gid(0).unwrap());
/// bad.port = 2;
/// assert!(pd.create_ah(&bad).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct Ah {
    handle: Arc<AhHandle>,
    pub(crate) av: AddressVector,
}

/// The device's address handle, destroyed with the last clone of its [`Ah`].
#[derive(Debug)]
struct AhHandle {
    pd: Pd,
    id: u32,
}

impl Drop for AhHandle {
    fn drop(&mut self) {
        let _ = self.pd.inner.ctx.inner.device.destroy_ah(self.id);
    }
}

impl Ah {
    /// The destination GID.
    pub fn gid(&self) -> Gid {
        Gid(self.av.dgid)
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &Pd {
        &self.handle.pd
    }

    /// The address vector it stands for.
    pub fn address_vector(&self) -> AddressVector {
        self.av
    }
}

impl Pd {
    /// Creates an address handle (`ibv_create_ah(3)`).
    pub fn create_ah(&self, attr: &AhAttr) -> Result<Ah, Error> {
        let av = attr.address_vector();
        // The device's rule, the one the drop-in's `ibv_create_ah` and every QP path get.
        let id = self
            .inner
            .ctx
            .inner
            .device
            .create_ah(self.inner.handle, av)?;
        Ok(Ah {
            handle: Arc::new(AhHandle {
                pd: self.clone(),
                id,
            }),
            av,
        })
    }
}
