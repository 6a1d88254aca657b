//! The provider-private `IBVERBS_PRIVATE_34` symbols: inert stubs.
//!
//! The real `libmlx5.so.1` and `libefa.so.1` (which perftest links) import 61 of these
//! and register themselves from an ELF constructor before `main`; every target binary is
//! linked `BIND_NOW`, so each must exist for the program to load (reference §2.3, §2.5).
//! None can do anything here: there is no kernel command channel and provider plugins
//! are never loaded.
//!
//! | symbol | kind | behaviour |
//! |---|---|---|
//! | `verbs_register_driver_34` | function | no-op; never keeps or reads the pointer it is given |
//! | `verbs_allow_disassociate_destroy` | 1-byte `bool` **data** | `false` |
//! | `execute_ioctl`, `ibv_cmd_*` (52) | functions returning an errno | `EOPNOTSUPP` |
//! | `_verbs_init_and_alloc_context`, `verbs_open_device` | functions returning a pointer | `NULL`, `errno = EOPNOTSUPP` |
//! | `__verbs_log`, `verbs_init_cq`, `verbs_set_ops`, `verbs_uninit_context` | `void` functions | no-op |
//!
//! `ibv_query_gid_type`, the one private symbol a program calls directly (`ibv_devinfo`),
//! is real and lives in [`crate::device`].
//!
//! The stubs take no declared arguments: under the x86_64 C calling convention a callee
//! that ignores its arguments may be declared without them.

use std::ffi::c_void;

// `verbs_allow_disassociate_destroy`: a `bool` providers read (and may set) to let
// destroy succeed after a device disassociation. A 1-byte data symbol, not a function,
// defined in assembly (only C reads it).
crate::symver_data!(verbs_allow_disassociate_destroy, "1", "IBVERBS_PRIVATE_34");

/// `verbs_register_driver_34`: providers call it from their constructor; the soft
/// library loads no provider, so it does nothing.
pub extern "C" fn verbs_register_driver_34(_: *const c_void) {}
symver!(verbs_register_driver_34, "IBVERBS_PRIVATE_34");

unsupported! {
    /// `__verbs_log` (provider logging).
    void "IBVERBS_PRIVATE_34" fn __verbs_log()
}
unsupported! {
    /// `verbs_init_cq` (provider helper).
    void "IBVERBS_PRIVATE_34" fn verbs_init_cq()
}
unsupported! {
    /// `verbs_set_ops` (provider helper).
    void "IBVERBS_PRIVATE_34" fn verbs_set_ops()
}
unsupported! {
    /// `verbs_uninit_context` (provider helper).
    void "IBVERBS_PRIVATE_34" fn verbs_uninit_context()
}
unsupported! {
    /// `_verbs_init_and_alloc_context` (provider helper).
    null "IBVERBS_PRIVATE_34" fn _verbs_init_and_alloc_context() -> *mut c_void
}
unsupported! {
    /// `verbs_open_device` (provider helper).
    null "IBVERBS_PRIVATE_34" fn verbs_open_device() -> *mut c_void
}
unsupported! {
    /// `execute_ioctl` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn execute_ioctl()
}
unsupported! {
    /// `ibv_cmd_advise_mr` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_advise_mr()
}
unsupported! {
    /// `ibv_cmd_alloc_dm` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_alloc_dm()
}
unsupported! {
    /// `ibv_cmd_alloc_mw` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_alloc_mw()
}
unsupported! {
    /// `ibv_cmd_alloc_pd` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_alloc_pd()
}
unsupported! {
    /// `ibv_cmd_attach_mcast` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_attach_mcast()
}
unsupported! {
    /// `ibv_cmd_close_xrcd` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_close_xrcd()
}
unsupported! {
    /// `ibv_cmd_create_ah` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_create_ah()
}
unsupported! {
    /// `ibv_cmd_create_counters` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_create_counters()
}
unsupported! {
    /// `ibv_cmd_create_cq_ex` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_create_cq_ex()
}
unsupported! {
    /// `ibv_cmd_create_flow` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_create_flow()
}
unsupported! {
    /// `ibv_cmd_create_flow_action_esp` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_create_flow_action_esp()
}
unsupported! {
    /// `ibv_cmd_create_qp_ex` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_create_qp_ex()
}
unsupported! {
    /// `ibv_cmd_create_qp_ex2` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_create_qp_ex2()
}
unsupported! {
    /// `ibv_cmd_create_rwq_ind_table` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_create_rwq_ind_table()
}
unsupported! {
    /// `ibv_cmd_create_srq` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_create_srq()
}
unsupported! {
    /// `ibv_cmd_create_srq_ex` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_create_srq_ex()
}
unsupported! {
    /// `ibv_cmd_create_wq` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_create_wq()
}
unsupported! {
    /// `ibv_cmd_dealloc_mw` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_dealloc_mw()
}
unsupported! {
    /// `ibv_cmd_dealloc_pd` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_dealloc_pd()
}
unsupported! {
    /// `ibv_cmd_dereg_mr` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_dereg_mr()
}
unsupported! {
    /// `ibv_cmd_destroy_ah` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_destroy_ah()
}
unsupported! {
    /// `ibv_cmd_destroy_counters` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_destroy_counters()
}
unsupported! {
    /// `ibv_cmd_destroy_cq` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_destroy_cq()
}
unsupported! {
    /// `ibv_cmd_destroy_flow` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_destroy_flow()
}
unsupported! {
    /// `ibv_cmd_destroy_flow_action` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_destroy_flow_action()
}
unsupported! {
    /// `ibv_cmd_destroy_qp` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_destroy_qp()
}
unsupported! {
    /// `ibv_cmd_destroy_rwq_ind_table` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_destroy_rwq_ind_table()
}
unsupported! {
    /// `ibv_cmd_destroy_srq` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_destroy_srq()
}
unsupported! {
    /// `ibv_cmd_destroy_wq` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_destroy_wq()
}
unsupported! {
    /// `ibv_cmd_detach_mcast` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_detach_mcast()
}
unsupported! {
    /// `ibv_cmd_free_dm` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_free_dm()
}
unsupported! {
    /// `ibv_cmd_get_context` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_get_context()
}
unsupported! {
    /// `ibv_cmd_modify_cq` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_modify_cq()
}
unsupported! {
    /// `ibv_cmd_modify_flow_action_esp` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_modify_flow_action_esp()
}
unsupported! {
    /// `ibv_cmd_modify_qp` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_modify_qp()
}
unsupported! {
    /// `ibv_cmd_modify_qp_ex` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_modify_qp_ex()
}
unsupported! {
    /// `ibv_cmd_modify_srq` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_modify_srq()
}
unsupported! {
    /// `ibv_cmd_modify_wq` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_modify_wq()
}
unsupported! {
    /// `ibv_cmd_open_qp` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_open_qp()
}
unsupported! {
    /// `ibv_cmd_open_xrcd` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_open_xrcd()
}
unsupported! {
    /// `ibv_cmd_query_context` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_query_context()
}
unsupported! {
    /// `ibv_cmd_query_device_any` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_query_device_any()
}
unsupported! {
    /// `ibv_cmd_query_mr` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_query_mr()
}
unsupported! {
    /// `ibv_cmd_query_port` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_query_port()
}
unsupported! {
    /// `ibv_cmd_query_qp` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_query_qp()
}
unsupported! {
    /// `ibv_cmd_query_srq` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_query_srq()
}
unsupported! {
    /// `ibv_cmd_read_counters` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_read_counters()
}
unsupported! {
    /// `ibv_cmd_reg_dm_mr` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_reg_dm_mr()
}
unsupported! {
    /// `ibv_cmd_reg_dmabuf_mr` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_reg_dmabuf_mr()
}
unsupported! {
    /// `ibv_cmd_reg_mr` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_reg_mr()
}
unsupported! {
    /// `ibv_cmd_rereg_mr` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_rereg_mr()
}
unsupported! {
    /// `ibv_cmd_resize_cq` (kernel command channel).
    errno "IBVERBS_PRIVATE_34" fn ibv_cmd_resize_cq()
}
