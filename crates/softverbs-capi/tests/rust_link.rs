//! The rlib links into a Rust executable even though its exports carry `.symver`
//! directives (`build.rs` gives integration tests the version-node map), and the exports
//! are plain Rust functions there.

#[test]
fn a_rust_program_can_call_the_exports_directly() {
    assert_eq!(softverbs_capi::misc::ibv_rate_to_mbps(3), 10000);
    assert_eq!(softverbs_capi::misc::ibv_fork_init(), 0);
}
