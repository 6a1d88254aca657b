//! The softverbs drop-in `libibverbs.so.1`: the verbs C ABI of rdma-core 44 over the soft
//! device, so that programs built against Debian's `libibverbs-dev` run unchanged with
//! `LD_LIBRARY_PATH` pointing at a directory where this cdylib is named `libibverbs.so.1`.
//!
//! | module | holds |
//! |---|---|
//! | [`abi`] | `#[repr(C)]` mirrors of the `verbs.h` structs, checked field by field against the installed header (`tests/abi_layout.rs`); re-exports [`verbs_h`] |
//! | [`verbs_h`] | every `verbs.h` value the library uses (`IBV_QPT_RC`, `IBV_WR_SEND`, …), named as in the header and checked against it |
//! | [`boundary`] | the panic boundary and the three failure conventions (`NULL`+errno, errno return, `-1`+errno) |
//! | [`handles`] | who owns every pointer that crosses the boundary; raw pointer → Rust reference, in one place (the handle contract) |
//! | [`device`] | device list, open/close, `ibv_import_device` and the command descriptors (`cmd_fd`), query device/port/GID/P_Key, `query_device_ex`, `query_rt_values_ex` |
//! | [`stats`] | the `SOFTVERBS_STATS` counters report (at `ibv_close_device` or exit) and the start of the `SOFTVERBS_LOG` / `RUST_LOG` logs (first use) |
//! | [`pd`] | protection domains, parent and thread domains, `ibv_import_pd` / `ibv_unimport_pd` |
//! | [`cq`] | completion channels, CQs and extended CQs, completion events |
//! | [`qp`] | queue pairs and their work requests (`post_send`, `post_recv`, the `ibv_qp_ex` builders) |
//! | [`wr`] | work-request pieces QPs and SRQs share (scatter/gather lists, receive requests, posting a list) |
//! | [`mr`] | memory regions and memory windows, `ibv_import_mr` / `ibv_unimport_mr` |
//! | [`srq`] | shared receive queues |
//! | [`ah`] | address handles |
//! | [`misc`] | string tables, fork support, sysfs, rate conversions, kernel-struct copies, async events, device-memory import (refused)/ECE |
//! | [`private`] | `IBVERBS_PRIVATE_34` provider symbols: inert stubs so libmlx5/libefa/librdmacm load |
//! | [`gsi`] | `SOFTVERBS_PRIVATE_1.0` to `_1.2`: QP1 management datagrams (`softverbs_gsi_send` / `_recv` / `_fd`, …) and `softverbs_app_waits`, a private ABI for softverbs' own librdmacm |
//!
//! # Symbol versions
//!
//! Every export is bound to its rdma-core version node (`IBVERBS_1.0` … `IBVERBS_1.14`,
//! `IBVERBS_PRIVATE_34`) by [`symver!`] next to the function: a `.symver trampoline,
//! name@@NODE` directive on a jump to the (mangled, local) Rust function, so the dynamic
//! symbol table holds exactly `name@@NODE`. `build.rs` defines the nodes and the SONAME.
//! (rustc's own version script would bind a plain `#[no_mangle]` export to `Base`.) The directives are left out of `cfg(test)` builds, whose
//! test executables have no version nodes.
//!
//! # Failure conventions
//!
//! Functions the soft device does not offer are present (every target is linked
//! `BIND_NOW`) and fail the way libibverbs documents: `NULL` with `errno = EOPNOTSUPP`, or
//! the errno `EOPNOTSUPP` returned, or `-1` with `errno`. Each area module lists its
//! functions and their status in a table.

pub mod abi;
pub mod boundary;
pub mod handles;
pub mod stats;
pub mod verbs_h;

/// Exports the function `$name` as the dynamic symbol `$name@@$node`.
///
/// The exported symbol is a one-instruction trampoline (`jmp` to the Rust function)
/// defined in the same assembly block as its `.symver` directive: the assembler requires a
/// default-version (`@@`) symbol to be defined in the object that names it, and rustc may
/// place a function and a `global_asm!` block in different codegen units (it does in
/// release builds). The trampoline's own name is made local by rustc's version script;
/// the Rust function keeps its mangled, local name. Function pointers the library stores
/// in ops tables point at the Rust functions directly, so only calls by symbol pay the
/// extra jump.
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

/// Exports a zero-initialised data object of `$size` bytes as `$name@@$node`. The object
/// lives in the assembly (no Rust item), for symbols only C code reads.
#[macro_export]
macro_rules! symver_data {
    ($name:ident, $size:literal, $node:literal) => {
        #[cfg(not(test))]
        ::std::arch::global_asm!(
            concat!(
                ".pushsection .bss.softverbs_export.",
                stringify!($name),
                ",\"aw\",@nobits"
            ),
            concat!(".globl softverbs_export.", stringify!($name)),
            concat!(".type softverbs_export.", stringify!($name), ",@object"),
            concat!(".size softverbs_export.", stringify!($name), ", ", $size),
            concat!("softverbs_export.", stringify!($name), ":"),
            concat!(".zero ", $size),
            concat!(
                ".symver softverbs_export.",
                stringify!($name),
                ", ",
                stringify!($name),
                "@@",
                $node
            ),
            ".popsection",
        );
    };
}

/// Defines an exported function the soft device does not offer, failing the way
/// libibverbs documents, and binds it to its version node:
/// - `null`: returns `NULL` with `errno = EOPNOTSUPP`;
/// - `errno`: returns `EOPNOTSUPP` (and sets `errno`);
/// - `minus_one`: returns `-1` with `errno = EOPNOTSUPP`;
/// - `void`: does nothing.
///
/// Arguments are never read, so the functions are safe to call with anything.
#[macro_export]
macro_rules! unsupported {
    ($(#[$m:meta])* null $node:literal fn $name:ident($($ty:ty),* $(,)?) -> $ret:ty) => {
        $(#[$m])*
        ///
        /// Not supported: returns `NULL` with `errno = EOPNOTSUPP`.
        pub extern "C" fn $name($(_: $ty),*) -> $ret {
            $crate::boundary::set_errno(::libc::EOPNOTSUPP);
            ::std::ptr::null_mut()
        }
        $crate::symver!($name, $node);
    };
    ($(#[$m:meta])* errno $node:literal fn $name:ident($($ty:ty),* $(,)?)) => {
        $(#[$m])*
        ///
        /// Not supported: returns `EOPNOTSUPP`.
        pub extern "C" fn $name($(_: $ty),*) -> ::std::ffi::c_int {
            $crate::boundary::set_errno(::libc::EOPNOTSUPP);
            ::libc::EOPNOTSUPP
        }
        $crate::symver!($name, $node);
    };
    ($(#[$m:meta])* minus_one $node:literal fn $name:ident($($ty:ty),* $(,)?)) => {
        $(#[$m])*
        ///
        /// Not supported: returns `-1` with `errno = EOPNOTSUPP`.
        pub extern "C" fn $name($(_: $ty),*) -> ::std::ffi::c_int {
            $crate::boundary::set_errno(::libc::EOPNOTSUPP);
            -1
        }
        $crate::symver!($name, $node);
    };
    ($(#[$m:meta])* void $node:literal fn $name:ident($($ty:ty),* $(,)?)) => {
        $(#[$m])*
        ///
        /// Not supported: does nothing.
        pub extern "C" fn $name($(_: $ty),*) {}
        $crate::symver!($name, $node);
    };
}

pub mod ah;
pub mod cq;
pub mod device;
pub mod gsi;
pub mod misc;
pub mod mr;
pub mod pd;
pub mod private;
pub mod qp;
pub mod srq;
pub mod wr;
