//! What a protection domain holds, kept by the device for both front doors:
//! `ibv_dealloc_pd(3)` fails with `EBUSY` while a memory region, queue pair, shared
//! receive queue or address handle is in the PD, and succeeds once the last is gone; an
//! object in a PD that was never allocated, or is deallocated, is `EINVAL` (the kernel's
//! answer to an unknown PD handle).

use softverbs_cq::CqBuilder;
use softverbs_device::{Device, DeviceConfig, DeviceError};
use softverbs_proto::{AccessFlags, AddressVector, Object, QpInit, QpType, SrqInit, VerbsError};

fn in_use_by(result: Result<(), DeviceError>) -> Object {
    match result {
        Err(DeviceError::Verbs(VerbsError::InUse {
            object: Object::Pd,
            by,
            count: 1,
        })) => by,
        other => panic!("expected InUse, got {other:?}"),
    }
}

fn is_no_such_pd<T: std::fmt::Debug>(result: &Result<T, DeviceError>) -> bool {
    matches!(
        result,
        Err(DeviceError::Verbs(VerbsError::NoSuchObject {
            object: Object::Pd,
            ..
        }))
    )
}

#[test]
fn a_pd_cannot_be_deallocated_while_an_object_is_in_it() {
    let device = Device::open(DeviceConfig::in_process()).unwrap();
    let cq = CqBuilder::new(16).build().unwrap();
    let mut buf = vec![0u8; 4096];

    let pd = device.alloc_pd();
    // SAFETY: `buf` outlives the registration (deregistered below).
    let mr = unsafe {
        device.reg_mr(
            pd,
            buf.as_mut_ptr() as usize,
            4096,
            buf.as_mut_ptr() as u64,
            AccessFlags::LOCAL_WRITE,
        )
    }
    .unwrap();
    assert_eq!(in_use_by(device.dealloc_pd(pd)), Object::Mr);
    device.dereg_mr(mr.lkey).unwrap();

    let qpn = device
        .create_qp(
            QpInit::new(QpType::Rc).with_pd(pd),
            cq.producer(),
            cq.producer(),
        )
        .unwrap();
    assert_eq!(in_use_by(device.dealloc_pd(pd)), Object::Qp);
    device.destroy_qp(qpn).unwrap();

    let srq = device.create_srq(pd, SrqInit::default()).unwrap();
    assert_eq!(in_use_by(device.dealloc_pd(pd)), Object::Srq);
    device.destroy_srq(srq).unwrap();

    let av = AddressVector {
        dgid: device.gid(0).unwrap().0,
        port_num: 1,
        is_global: true,
        ..AddressVector::default()
    };
    let ah = device.create_ah(pd, av).unwrap();
    assert_eq!(in_use_by(device.dealloc_pd(pd)), Object::Ah);
    assert_eq!(device.destroy_ah(ah).unwrap().av, av);

    device.dealloc_pd(pd).unwrap();
    let gone = device.dealloc_pd(pd);
    assert!(is_no_such_pd(&gone), "{gone:?}");
}

#[test]
fn objects_in_a_pd_never_allocated_or_deallocated_are_einval() {
    let device = Device::open(DeviceConfig::in_process()).unwrap();
    let cq = CqBuilder::new(16).build().unwrap();
    let gone = device.alloc_pd();
    device.dealloc_pd(gone).unwrap();
    let mut buf = vec![0u8; 4096];
    for pd in [gone, 0x7777] {
        // SAFETY: refused before anything is recorded.
        let mr = unsafe {
            device.reg_mr(
                pd,
                buf.as_mut_ptr() as usize,
                4096,
                0,
                AccessFlags::LOCAL_WRITE,
            )
        };
        assert!(is_no_such_pd(&mr), "{mr:?}");
        let qp = device.create_qp(
            QpInit::new(QpType::Rc).with_pd(pd),
            cq.producer(),
            cq.producer(),
        );
        assert!(is_no_such_pd(&qp), "{qp:?}");
        let srq = device.create_srq(pd, SrqInit::default());
        assert!(is_no_such_pd(&srq), "{srq:?}");
        let av = AddressVector {
            port_num: 1,
            is_global: true,
            ..AddressVector::default()
        };
        let ah = device.create_ah(pd, av);
        assert!(is_no_such_pd(&ah), "{ah:?}");
    }
    assert_eq!(cq.attached_qps(), 0, "no QP was attached to the CQ");
}

// ibv_import_pd(3), ibv_import_mr(3): a PD and a registration are found by their handles
// (a region's handle is its lkey) while they live, and not after they are gone.
#[test]
fn pds_and_regions_are_found_by_handle_while_they_live() {
    let device = Device::open(DeviceConfig::in_process()).unwrap();
    let mut buf = vec![0u8; 4096];
    let pd = device.alloc_pd();
    device.query_pd(pd).unwrap();
    assert!(is_no_such_pd(&device.query_pd(pd + 1000)));
    // SAFETY: `buf` outlives the registration (deregistered below).
    let mr = unsafe {
        device.reg_mr(
            pd,
            buf.as_mut_ptr() as usize,
            4096,
            buf.as_mut_ptr() as u64,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
    }
    .unwrap();
    assert_eq!(device.query_mr(mr.lkey).unwrap(), mr);
    device.dereg_mr(mr.lkey).unwrap();
    assert!(matches!(
        device.query_mr(mr.lkey),
        Err(DeviceError::Verbs(VerbsError::NoSuchObject {
            object: Object::Mr,
            ..
        }))
    ));
    device.dealloc_pd(pd).unwrap();
    assert!(is_no_such_pd(&device.query_pd(pd)));
}
