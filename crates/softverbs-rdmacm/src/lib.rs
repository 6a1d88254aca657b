//! The softverbs drop-in `librdmacm.so.1`: the RDMA connection manager of rdma-core 44
//! (`rdma_cma.h`) over the soft device, so that programs built against Debian's
//! `librdmacm-dev` (rping, ucmatose, udaddy, rdma_server/rdma_client, cmtime, perftest's
//! `-R`) run unchanged with `LD_LIBRARY_PATH` pointing at a directory where this cdylib is
//! named `librdmacm.so.1` and softverbs-capi's is named `libibverbs.so.1`.
//!
//! It never links the device: contexts, PDs, CQs and QPs are the loaded libibverbs.so.1's,
//! reached through its public `ibv_*` functions (`dlopen` + `dlvsym`, [`verbs`]), and the
//! connection management datagrams travel on QP1 through softverbs' private GSI exports.
//! The IB CM protocol itself (MADs, connection state machines, the CMA private data header)
//! is the sans-IO crate softverbs-cm; one thread per process drives it ([`cm`]).
//!
//! | module | holds |
//! |---|---|
//! | [`abi`] | `#[repr(C)]` mirrors of the `rdma_cma.h` structs (and the `verbs.h` / `sa.h` ones used), checked against the headers (`tests/abi_layout.rs`) |
//! | [`boundary`] | the panic boundary and the failure conventions (`-1` + `errno`, `NULL` + `errno`) |
//! | [`verbs`] | the loaded libibverbs' functions and softverbs' GSI exports |
//! | [`addr`] | `sockaddr` ↔ `SocketAddr`, IP ↔ GID |
//! | [`state`] | the process-wide tables: devices, channels, ids, events, ports |
//! | [`channel`] | event channels, `rdma_get_cm_event`, `rdma_ack_cm_event`, `rdma_event_str` |
//! | [`id`] | ids, binding, address and route resolution, listening, options, migration |
//! | [`qp`] | QPs, SRQs and `rdma_init_qp_attr` |
//! | [`cm`] | the CM thread: softverbs-cm driven over the GSI, its events turned into rdma_cm events |
//! | [`conn`] | connect, get_request, accept, reject, disconnect, establish, notify, ECE |
//! | [`devices`] | `rdma_get_devices` / `rdma_free_devices` |
//! | [`getaddrinfo`] | `rdma_getaddrinfo`, `rdma_create_ep` and their frees |
//! | [`multicast`] | `rdma_join_multicast`, `_ex`, `rdma_leave_multicast`: UD multicast joins as the kernel's CM makes them on RoCE |
//! | [`unsupported`] | rsockets: documented refusals |
//!
//! # Symbol versions
//!
//! Every export is bound to its rdma-core node (`RDMACM_1.0` … `RDMACM_1.3`) by
//! [`symver!`] next to the function, the technique of softverbs-capi: a `.symver
//! trampoline, name@@NODE` directive on a jump to the Rust function. `build.rs` defines
//! the nodes and the SONAME.

pub mod abi;
pub mod addr;
pub mod boundary;
pub mod channel;
pub mod cm;
pub mod conn;
pub mod devices;
pub mod getaddrinfo;
pub mod id;
pub mod multicast;
pub mod qp;
pub mod state;
pub mod unsupported;
pub mod verbs;

/// Exports the function `$name` as the dynamic symbol `$name@@$node` (softverbs-capi's
/// `symver!`: a one-instruction trampoline defined with its `.symver` directive in one
/// assembly block, so the directive and the symbol share an object file). Left out of
/// `cfg(test)` builds, whose test executables have no version nodes.
#[macro_export]
macro_rules! symver {
    ($name:ident, $node:literal) => {
        #[cfg(not(test))]
        ::std::arch::global_asm!(
            concat!(".pushsection .text.softverbs_export.", stringify!($name), ",\"ax\",@progbits"),
            ".p2align 4",
            concat!(".globl softverbs_export.", stringify!($name)),
            concat!(".type softverbs_export.", stringify!($name), ",@function"),
            concat!("softverbs_export.", stringify!($name), ":"),
            "jmp {item}",
            concat!(".size softverbs_export.", stringify!($name), ", . - softverbs_export.", stringify!($name)),
            concat!(".symver softverbs_export.", stringify!($name), ", ", stringify!($name), "@@", $node),
            ".popsection",
            item = sym $name,
        );
    };
}
