//! Which handles cross threads: every handle is `Send + Sync` except the single-threaded
//! CQ, which is `Send` only (`ibv_create_cq_ex(3)`, IBV_CREATE_CQ_ATTR_SINGLE_THREADED:
//! "the CQ will be accessed from a single thread").

use softverbs::*;

fn send_sync<T: Send + Sync>() {}
fn send<T: Send>() {}

#[test]
fn handles_are_send_and_sync_and_the_single_threaded_cq_is_send() {
    send_sync::<Context>();
    send_sync::<Pd>();
    send_sync::<Mr>();
    send_sync::<Cq>();
    send_sync::<CompChannel>();
    send_sync::<Qp>();
    send_sync::<Srq>();
    send_sync::<Ah>();
    send_sync::<SendRequest>();
    send_sync::<RecvRequest>();
    send::<LocalCq>();
}
