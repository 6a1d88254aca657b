//! The device list and [`Context`], an open device (`ibv_get_device_list(3)`,
//! `ibv_open_device(3)`, `ibv_query_device(3)`, `ibv_query_port(3)`, `ibv_query_gid(3)`,
//! `ibv_get_async_event(3)`).
//!
//! A [`Context`] is a cheap handle (an `Arc`): every object created from it holds one, so
//! the device stays open until the last PD, MR, CQ, QP, SRQ and AH is gone.

use crate::error::Error;
use softverbs_device::{
    network_from_env, AsyncEvent, Device, DeviceAttr, DeviceConfig, Gid, PortAttr,
};
use std::sync::Arc;
use std::time::Duration;

pub use softverbs_device::{NetworkKind, NETWORK_ENV};

/// One entry of the device list (`struct ibv_device`).
///
/// ```
/// let list = softverbs::devices();
/// assert_eq!(list.len(), 1);
/// assert_eq!(list[0].name(), "softverbs0");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    name: String,
    network: Result<NetworkKind, String>,
}

impl DeviceInfo {
    /// The device name (`ibv_get_device_name(3)`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The network the device would use, from `SOFTVERBS_NETWORK`; `None` if that variable
    /// holds something else (opening then fails).
    pub fn network(&self) -> Option<NetworkKind> {
        self.network.clone().ok()
    }

    /// Opens the device, as [`Context::open`].
    pub fn open(&self) -> Result<Context, Error> {
        Context::open()
    }
}

/// The devices of this machine (`ibv_get_device_list(3)`): always the one soft device.
pub fn devices() -> Vec<DeviceInfo> {
    vec![DeviceInfo {
        name: "softverbs0".into(),
        network: network_from_env(),
    }]
}

pub(crate) struct ContextInner {
    pub(crate) device: Device,
}

/// An open device (`struct ibv_context`).
///
/// Cloning gives another handle to the same device.
///
/// ```
/// use softverbs::{Context, DeviceConfig};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// assert!(ctx.query_device().max_qp_wr >= 16384);
/// assert!(ctx.query_port(1)?.active);
/// assert!(ctx.gid(0).is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Context").field(&self.inner.device).finish()
    }
}

impl Context {
    /// Opens the device as the environment says, as the drop-in does
    /// ([`DeviceConfig::from_env`]): `SOFTVERBS_NETWORK=inprocess|udp` (default `udp`), for
    /// UDP `SOFTVERBS_ADDR` (`IP`, `IP:PORT` or `[IPv6]:PORT`; unset, the first free
    /// 127.0.0.x:4791), and `SOFTVERBS_PCAP` / `SOFTVERBS_FAULTS` on either network.
    pub fn open() -> Result<Context, Error> {
        network_from_env().map_err(Error::BadNetwork)?;
        Context::open_with(DeviceConfig::from_env()?)
    }

    /// Opens a device with an explicit configuration.
    pub fn open_with(config: DeviceConfig) -> Result<Context, Error> {
        let device = Device::open(config)?;
        Ok(Context {
            inner: Arc::new(ContextInner { device }),
        })
    }

    /// The device underneath, for what this API does not wrap (counters, the in-process
    /// shortcut switch, …).
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The device name.
    pub fn name(&self) -> &str {
        self.inner.device.name()
    }

    /// Whether the device talks over UDP (as opposed to in-process only).
    pub fn network(&self) -> NetworkKind {
        if self.inner.device.transport_counters().is_some() {
            NetworkKind::Udp
        } else {
            NetworkKind::InProcess
        }
    }

    /// The device's limits (`ibv_query_device(3)`).
    pub fn query_device(&self) -> DeviceAttr {
        self.inner.device.query_device()
    }

    /// A port's attributes (`ibv_query_port(3)`); only port 1 exists.
    pub fn query_port(&self, port: u8) -> Result<PortAttr, Error> {
        Ok(self.inner.device.query_port(u32::from(port))?)
    }

    /// GID table entry `index` of port 1 (`ibv_query_gid(3)`), the table laid out as
    /// kernel rxe lays it out: index 0 the IPv6 link-local GID (made from the device's
    /// address, e.g. `fe80::ffff:127.0.0.2`), index 1 the address's own GID
    /// (`::ffff:127.0.0.2`, the one programs written for rxe pick for IPv4 RoCEv2). Both
    /// reach this device from another softverbs device; a kernel rxe peer needs index 1.
    ///
    /// ```
    /// use softverbs::{Context, DeviceConfig};
    /// let ctx = Context::open_with(DeviceConfig::in_process())?;
    /// let address = ctx.device().address();
    /// assert_eq!(ctx.gid(1).map(std::net::IpAddr::from), Some(address));
    /// assert!(ctx.gid(0).unwrap().to_string().starts_with("fe80::"));
    /// assert_eq!(ctx.gid(2), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn gid(&self, index: u32) -> Option<Gid> {
        self.inner.device.gid(index)
    }

    /// Receives and handles what has arrived, without blocking. [`Cq::poll`](crate::Cq::poll)
    /// calls it when it finds its CQ empty; a progress thread also runs it.
    pub fn progress(&self) {
        self.inner.device.progress();
    }

    /// Waits for the next asynchronous event (`ibv_get_async_event(3)`). The event needs no
    /// acknowledgement: it is a value.
    pub fn async_event(&self) -> Result<AsyncEvent, Error> {
        loop {
            if let Some(event) = self.inner.device.async_events().next(None)? {
                return Ok(event);
            }
        }
    }

    /// Takes the next asynchronous event if one is queued.
    pub fn try_async_event(&self) -> Option<AsyncEvent> {
        self.inner.device.async_events().try_next()
    }

    /// Waits up to `timeout` for the next asynchronous event.
    pub fn async_event_timeout(&self, timeout: Duration) -> Result<Option<AsyncEvent>, Error> {
        Ok(self.inner.device.async_events().next(Some(timeout))?)
    }

    pub(crate) fn same(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}
