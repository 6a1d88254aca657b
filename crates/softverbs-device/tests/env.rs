//! `SOFTVERBS_ADDR` (udp module documentation). Alone in its own test binary, because
//! it changes the process environment.

use std::io;

use softverbs_device::udp::ADDR_ENV;
use softverbs_device::{Transport, UdpConfig, UdpTransport};

// DESIGN "Pick the device address from configuration, with a sensible automatic
// default": SOFTVERBS_ADDR wins when set (address and port), garbage is an error, and
// without it the automatic 127.0.0.x:4791 scheme applies.
#[test]
fn softverbs_addr_sets_the_device_address() {
    std::env::set_var(ADDR_ENV, "127.0.0.40:0");
    let transport = UdpTransport::from_env().expect("bind SOFTVERBS_ADDR");
    assert_eq!(transport.local().addr().to_string(), "127.0.0.40");
    assert_ne!(transport.local().port(), 0);

    std::env::set_var(ADDR_ENV, "[::1]:0");
    let transport = UdpTransport::from_env().expect("bind SOFTVERBS_ADDR=[::1]:0");
    assert_eq!(transport.local().gid().to_string(), "::1");

    std::env::set_var(ADDR_ENV, "127.0.0.41");
    let config = UdpConfig::from_env().unwrap();
    assert_eq!(config.address, Some("127.0.0.41".parse().unwrap()));
    assert_eq!(config.port, 4791);

    std::env::set_var(ADDR_ENV, "not an address");
    assert_eq!(
        UdpConfig::from_env().unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );

    std::env::remove_var(ADDR_ENV);
    assert_eq!(UdpConfig::from_env().unwrap(), UdpConfig::default());
}
