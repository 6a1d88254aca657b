//! The drop-in opens its device as the safe API does (`DeviceConfig::from_env`), so
//! `SOFTVERBS_NETWORK=inprocess` gives a C program a device with no socket (its GID is an
//! in-process address, 127.1.0.0/16), where the drop-in used to open a UDP device whatever
//! the variable said. Alone in its own test binary, because it changes the process
//! environment before the drop-in opens its device.

use softverbs_capi::abi::ibv_gid;
use softverbs_capi::device::{
    ibv_close_device, ibv_free_device_list, ibv_get_device_list, ibv_open_device, ibv_query_gid,
};

#[test]
fn softverbs_network_inprocess_reaches_the_drop_in() {
    std::env::set_var("SOFTVERBS_NETWORK", "inprocess");
    let mut num = 0;
    // SAFETY: `num` is writable; the list is freed below.
    let list = unsafe { ibv_get_device_list(&mut num) };
    assert!(!list.is_null() && num == 1, "one device");
    // SAFETY: `list` holds `num` (1) devices.
    let context = unsafe { ibv_open_device(*list) };
    assert!(!context.is_null());
    let mut gid = ibv_gid { raw: [0; 16] };
    // SAFETY: `context` is open, `gid` writable.
    // GID 1 is the device's address (GID 0 the link-local GID made from it).
    assert_eq!(unsafe { ibv_query_gid(context, 1, 1, &mut gid) }, 0);
    // SAFETY: every 16-byte pattern is a valid `[u8; 16]`.
    let raw = unsafe { gid.raw };
    assert_eq!(&raw[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
    assert_eq!(&raw[12..14], &[127, 1], "an in-process address: {raw:?}");
    // SAFETY: open, nothing created in it; the list came from ibv_get_device_list.
    unsafe {
        assert_eq!(ibv_close_device(context), 0);
        ibv_free_device_list(list);
    }
}
