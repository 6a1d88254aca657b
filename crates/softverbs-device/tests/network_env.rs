//! `SOFTVERBS_NETWORK` chooses a device's network, read once, in the device, for both front
//! doors (`DeviceConfig::from_env`): `inprocess` gives a device with no socket, `udp` (and
//! nothing set) a UDP device, anything else an `InvalidInput` error that names the
//! variable and the value. Alone in its own test binary, because it changes the process
//! environment.

use std::io;

use softverbs_device::{Device, DeviceConfig, NETWORK_ENV};

#[test]
fn softverbs_network_chooses_the_devices_network_for_every_front_door() {
    std::env::set_var("SOFTVERBS_ADDR", "127.0.0.42:0");
    std::env::set_var(NETWORK_ENV, "inprocess");
    let device = Device::open(DeviceConfig::from_env().unwrap()).unwrap();
    assert!(
        device.transport_counters().is_none(),
        "no socket in process"
    );
    assert!(device.address().to_string().starts_with("127.1."));
    drop(device);

    std::env::set_var(NETWORK_ENV, "UDP");
    let device = Device::open(DeviceConfig::from_env().unwrap()).unwrap();
    assert!(device.transport_counters().is_some(), "a UDP device");
    assert_eq!(device.address().to_string(), "127.0.0.42");
    drop(device);

    std::env::set_var(NETWORK_ENV, "carrier-pigeon");
    let error = DeviceConfig::from_env().unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    let text = error.to_string();
    assert!(
        text.contains("SOFTVERBS_NETWORK") && text.contains("carrier-pigeon"),
        "{text}"
    );

    std::env::remove_var(NETWORK_ENV);
    let device = Device::open(DeviceConfig::from_env().unwrap()).unwrap();
    assert!(device.transport_counters().is_some(), "UDP is the default");
    std::env::remove_var("SOFTVERBS_ADDR");
}
