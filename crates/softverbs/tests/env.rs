//! `Context::open` from the environment (`SOFTVERBS_NETWORK`, `SOFTVERBS_ADDR`). One test
//! in its own binary, because it changes the process environment.

use softverbs::*;

/// `SOFTVERBS_NETWORK=inprocess` opens an in-process device; `udp` with `SOFTVERBS_ADDR`
/// binds that address; anything else is an error value (EINVAL), not a panic.
#[test]
fn open_follows_softverbs_network_and_softverbs_addr() {
    std::env::set_var(NETWORK_ENV, "inprocess");
    assert_eq!(devices()[0].network(), Some(NetworkKind::InProcess));
    let ctx = Context::open().unwrap();
    assert_eq!(ctx.network(), NetworkKind::InProcess);
    assert_eq!(ctx.name(), "softverbs0");

    std::env::set_var(NETWORK_ENV, "udp");
    std::env::set_var("SOFTVERBS_ADDR", "127.0.0.231");
    let ctx = devices()[0].open().unwrap();
    assert_eq!(ctx.network(), NetworkKind::Udp);
    // GID 1 is the address itself (GID 0 the link-local GID made from it).
    assert_eq!(
        ctx.gid(1).unwrap(),
        Gid::from_ip("127.0.0.231".parse().unwrap())
    );
    drop(ctx);

    std::env::set_var(NETWORK_ENV, "carrier-pigeon");
    assert_eq!(devices()[0].network(), None);
    let e = Context::open().unwrap_err();
    assert!(matches!(e, Error::BadNetwork(_)));
    assert_eq!(e.errno(), 22);

    std::env::set_var(NETWORK_ENV, "udp");
    std::env::set_var("SOFTVERBS_ADDR", "not an address");
    assert!(Context::open().is_err());
}
