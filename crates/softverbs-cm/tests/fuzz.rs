//! `Cm::handle_mad` never panics, whatever it is given, in whatever state (the crate's
//! no-panic contract): seeded random bytes of every length, truncated and extended MADs,
//! MADs with random attribute IDs, and valid MADs of live connections with bytes flipped.
//! Everything the CM sends in answer is a well-formed CM MAD.

mod common;

use common::{Pair, Side, GID_A, GID_B};
use rand::{Rng, SeedableRng};
use softverbs_cm::mad::{CmMessage, MAD_LEN};
use softverbs_cm::{Cm, CmEvent, ConnectRequest, MadSource, Reply};

const SERVICE: u64 = 0x0000_0000_0106_0001;

fn check_outputs(cm: &mut Cm) {
    while let Some(m) = cm.poll_transmit() {
        assert!(
            CmMessage::parse(&m.bytes).is_ok(),
            "the CM sent an unparsable MAD: {m:?}"
        );
        assert_eq!(m.dest_qpn, 1);
    }
    while cm.poll_event().is_some() {}
    let _ = cm.poll_timeout();
}

/// A pair with connections in several states, and the valid MADs seen on the way.
fn populated(seed: u64) -> (Pair, Vec<[u8; MAD_LEN]>) {
    let mut p = Pair::new(seed);
    p.b.listen(SERVICE).expect("listen");
    p.a.listen(SERVICE + 1).expect("listen");
    let mut seen = Vec::new();
    for i in 0..6u32 {
        let mut r = ConnectRequest::new(SERVICE, GID_A, GID_B, 0x100 + i, i);
        r.remote_cm_response_timeout = 8;
        r.max_cm_retries = 2;
        p.a.connect(p.now, r).expect("connect");
        p.deliver(|_, m| {
            seen.push(m.bytes);
            false
        });
    }
    let reqs: Vec<_> = p
        .take_events(Side::B)
        .into_iter()
        .filter_map(|e| match e {
            CmEvent::ReqReceived { conn, .. } => Some(conn),
            _ => None,
        })
        .collect();
    // Leave them in different states: some accepted, some rejected, some pending.
    for (i, conn) in reqs.into_iter().enumerate() {
        match i % 3 {
            0 => {
                p.b.accept(p.now, conn, Reply::new(0x200 + i as u32, 7))
                    .expect("accept")
            }
            1 => p.b.reject(p.now, conn, 28, b"no").expect("reject"),
            _ => {}
        }
    }
    p.deliver(|_, m| {
        seen.push(m.bytes);
        false
    });
    for e in p.take_events(Side::A) {
        if let CmEvent::RepReceived { conn, .. } = e {
            p.a.ready_to_use(p.now, conn, &[]).expect("rtu");
        }
    }
    p.deliver(|_, m| {
        seen.push(m.bytes);
        false
    });
    (p, seen)
}

#[test]
fn random_truncated_and_mutated_mads_never_panic_handle_mad() {
    for seed in 0..8u64 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let (mut p, seen) = populated(seed);
        assert!(!seen.is_empty());
        let from = MadSource {
            sgid: GID_B,
            src_qpn: 1,
        };
        for i in 0..20_000u32 {
            let bytes: Vec<u8> = match rng.gen_range(0..5) {
                // Random bytes of random length.
                0 => {
                    let len = rng.gen_range(0..300);
                    (0..len).map(|_| rng.gen()).collect()
                }
                // A valid CM header, a random attribute and random body.
                1 => {
                    let mut m = [0u8; MAD_LEN];
                    rng.fill(&mut m[..]);
                    m[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
                    m[16] = 0;
                    m[17] = rng.gen_range(0x0F..0x1C);
                    m.to_vec()
                }
                // A seen MAD with a few bytes flipped.
                2 => {
                    let mut m = seen[rng.gen_range(0..seen.len())];
                    for _ in 0..rng.gen_range(1..6) {
                        let at = rng.gen_range(0..MAD_LEN);
                        m[at] ^= 1 << rng.gen_range(0..8);
                    }
                    m.to_vec()
                }
                // A seen MAD truncated or extended.
                3 => {
                    let m = seen[rng.gen_range(0..seen.len())];
                    let mut v = m.to_vec();
                    if rng.gen_bool(0.5) {
                        v.truncate(rng.gen_range(0..MAD_LEN));
                    } else {
                        v.extend((0..rng.gen_range(1..40)).map(|_| rng.gen::<u8>()));
                    }
                    v
                }
                // A seen MAD as is (duplicates, in any state).
                _ => seen[rng.gen_range(0..seen.len())].to_vec(),
            };
            let now = p.now + u64::from(i) * 1_000;
            if rng.gen_bool(0.5) {
                p.a.handle_mad(now, from, &bytes);
            } else {
                p.b.handle_mad(
                    now,
                    MadSource {
                        sgid: GID_A,
                        src_qpn: 1,
                    },
                    &bytes,
                );
            }
            if i % 97 == 0 {
                p.a.handle_timeout(now);
                p.b.handle_timeout(now);
            }
            check_outputs(&mut p.a);
            check_outputs(&mut p.b);
        }
        let c = p.a.counters();
        assert!(c.malformed > 0 && c.mads_received >= 9_000, "{c:?}");
    }
}
