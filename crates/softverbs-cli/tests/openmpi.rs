//! Open MPI 4.1 (Debian's `openmpi-bin`, `libopenmpi-dev`) on the drop-in: an MPI
//! ping-pong over 2 ranks and `MPI_Allreduce` over 4 ranks, with the verbs path forced —
//! `--mca pml ucx` (UCX over rc_verbs) and `--mca pml cm --mca mtl ofi` with libfabric's
//! `verbs;ofi_rxd` and with `verbs;ofi_rxm` (RC connections through the drop-in
//! librdmacm) — and every rank's device counters showing that softverbs carried the
//! messages.
//!
//! `mpirun` itself runs under `softverbs run`, so every rank inherits the drop-in on
//! `LD_LIBRARY_PATH` (exported with `-x`) and, for `pml ucx`, the namespace of `--dev-node`
//! where UCX sees softverbs0; the ranks keep the caller's identity, so `mpirun` needs
//! `--allow-run-as-root` only when the caller is root. Each rank is its own process with
//! its own device: `mpirun` starts a small wrapper that sets `SOFTVERBS_ADDR` to
//! 127.0.0.(base + `OMPI_COMM_WORLD_RANK`) and execs the program.
//! `--mca btl openib` is not among them: Debian's Open MPI 4.1.4 builds the openib BTL
//! with the udcm connection scheme only (no rdmacm CPC: `mca_btl_openib.so` does not link
//! librdmacm), udcm refuses a port whose link layer is not InfiniBand (softverbs is RoCE),
//! and the BTL first wants `$(ibv_get_sysfs_path)/class/infiniband` to be a directory.
//!
//! A missing program is a failure naming the Debian package, never a skip.

mod common;
#[path = "common/stacks.rs"]
mod stacks;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Bound on one `mpirun`.
const LIMIT: Duration = Duration::from_secs(180);

/// Two ranks bounce an 8-byte message 1000 times (the reply carries the count plus one,
/// checked), twice, and rank 0 prints the half round trip of the second pass.
const PINGPONG: &str = include_str!("c/mpi_pingpong.c");

/// Every rank contributes (rank + 1) * (i + round) to element i; 50 rounds of 1024 longs
/// (8 KiB), each sum checked on every rank.
const ALLREDUCE: &str = r#"#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int rank, size;
    static long in[1024], out[1024];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long ranks = (long)size * (size + 1) / 2;
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < 1024; i++)
            in[i] = (long)(rank + 1) * (i + round);
        MPI_Allreduce(in, out, 1024, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        for (int i = 0; i < 1024; i++)
            if (out[i] != ranks * (i + round)) {
                fprintf(stderr, "rank %d: out[%d] = %ld\n", rank, i, out[i]);
                MPI_Abort(MPI_COMM_WORLD, 3);
            }
    }
    if (rank == 0)
        printf("allreduce ok: %d ranks, 50 rounds of 1024 longs\n", size);
    MPI_Finalize();
    return 0;
}
"#;

/// Sets the rank's device address from its rank and runs the program.
const RANK_WRAPPER: &str = "#!/bin/sh\n\
export SOFTVERBS_ADDR=127.0.0.$((SOFTVERBS_RANK_BASE + OMPI_COMM_WORLD_RANK))\n\
exec \"$@\"\n";

fn build_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("softverbs-mpi");
    std::fs::create_dir_all(&dir).expect("create the MPI build directory");
    dir
}

/// A name in the build directory no other test thread or process writes: tests run in
/// parallel, and writing a file another test is executing fails with `ETXTBSY`, so every
/// artifact is made under a private name and renamed into place (a rename never disturbs a
/// running executable).
fn private_path(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    build_dir().join(format!(".{name}.{}.{n}", std::process::id()))
}

/// Compiles `source` with `mpicc` into `name`.
fn mpicc(source: &str, name: &str) -> PathBuf {
    let mpicc = stacks::program("mpicc", "libopenmpi-dev");
    let dir = build_dir();
    let src = private_path(&format!("{name}.c"));
    std::fs::write(&src, source).expect("write the MPI program");
    let built = private_path(name);
    let out = Command::new(mpicc)
        .args(["-std=gnu11", "-O2", "-Wall", "-Werror", "-x", "c", "-o"])
        .arg(&built)
        .arg(&src)
        .output()
        .expect("run mpicc");
    let _ = std::fs::remove_file(&src);
    assert!(
        out.status.success(),
        "mpicc {name}.c failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exe = dir.join(name);
    std::fs::rename(&built, &exe).expect("move the MPI program into place");
    exe
}

fn rank_wrapper() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let written = private_path("rank-address.sh");
    std::fs::write(&written, RANK_WRAPPER).expect("write the rank wrapper");
    std::fs::set_permissions(&written, std::fs::Permissions::from_mode(0o755))
        .expect("make the rank wrapper executable");
    let path = build_dir().join("rank-address.sh");
    std::fs::rename(&written, &path).expect("move the rank wrapper into place");
    path
}

/// The verbs path an `mpirun` is forced onto.
#[derive(Clone, Copy, Debug)]
enum VerbsPath {
    /// `--mca pml ucx`, UCX over rc_verbs (UD as its wire-up transport).
    PmlUcx,
    /// `--mca pml cm --mca mtl ofi`, libfabric's `verbs;ofi_rxd`.
    MtlOfiRxd,
    /// `--mca pml cm --mca mtl ofi`, libfabric's `verbs;ofi_rxm`: RC endpoints the verbs
    /// provider connects through the drop-in librdmacm.
    MtlOfiRxm,
}

/// Runs `program` over `ranks` ranks on `path`, rank r as 127.0.0.(base + r); asserts it
/// ended well and every rank's device carried at least `min` packets each way; returns
/// stdout.
fn mpirun(path: VerbsPath, program: &Path, ranks: u32, base: u32, min: u64) -> String {
    let mpirun = stacks::program("mpirun", "openmpi-bin");
    let np = ranks.to_string();
    let wrapper = rank_wrapper();
    let mut args: Vec<String> = ["--oversubscribe", "-np", &np, "--mca", "btl", "self"]
        .map(String::from)
        .to_vec();
    match path {
        VerbsPath::PmlUcx => args.extend(
            [
                "--mca",
                "pml",
                "ucx",
                "-x",
                "UCX_TLS=rc_verbs,ud_verbs:aux",
                "-x",
                "UCX_NET_DEVICES=softverbs0:1",
            ]
            .map(String::from),
        ),
        VerbsPath::MtlOfiRxd => args.extend(
            [
                "--mca",
                "pml",
                "cm",
                "--mca",
                "mtl",
                "ofi",
                "-x",
                "FI_PROVIDER=verbs;ofi_rxd",
            ]
            .map(String::from),
        ),
        VerbsPath::MtlOfiRxm => args.extend(
            [
                "--mca",
                "pml",
                "cm",
                "--mca",
                "mtl",
                "ofi",
                "-x",
                "FI_PROVIDER=verbs;ofi_rxm",
            ]
            .map(String::from),
        ),
    }
    for name in ["LD_LIBRARY_PATH", "SOFTVERBS_STATS", "SOFTVERBS_RANK_BASE"] {
        args.extend(["-x".to_string(), name.to_string()]);
    }
    args.push(wrapper.display().to_string());
    args.push(program.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // UCX needs the device node; libfabric's verbs provider does not.
    let dev_node = matches!(path, VerbsPath::PmlUcx);
    let mut command = stacks::softverbs_run(&format!("mpi-{base}"), dev_node, mpirun, &args);
    command
        .env("SOFTVERBS_STATS", "stderr")
        .env("SOFTVERBS_RANK_BASE", base.to_string());
    if rustix::process::geteuid().is_root() {
        // mpirun refuses root unless told; --dev-node keeps the caller's uid, so a normal
        // user needs nothing.
        command
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    }
    let (status, stdout, stderr) = stacks::run_bounded(&mut command, LIMIT);
    let all = format!("{path:?} ({status:?}):\n{stdout}\n{stderr}");
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{all}");
    for rank in 0..ranks {
        let address = format!("127.0.0.{}", base + rank);
        let line = stacks::assert_carried(&stderr, &address, min);
        if matches!(path, VerbsPath::PmlUcx | VerbsPath::MtlOfiRxm) {
            assert!(
                stacks::counter(line, "acks_sent") > 0,
                "rank {rank} sent no RC acknowledgement: {line}"
            );
        }
    }
    stdout
}

#[test]
fn mpi_pingpong_runs_over_pml_ucx_on_rc_verbs() {
    let exe = mpicc(PINGPONG, "pingpong-ucx");
    let out = mpirun(VerbsPath::PmlUcx, &exe, 2, 160, 1000);
    assert!(out.contains("pingpong ok: 1000 round trips"), "{out}");
    eprintln!("pml ucx: {}", out.trim());
}

#[test]
fn mpi_allreduce_over_four_ranks_runs_over_pml_ucx_on_rc_verbs() {
    let exe = mpicc(ALLREDUCE, "allreduce-ucx");
    let out = mpirun(VerbsPath::PmlUcx, &exe, 4, 162, 50);
    assert!(out.contains("allreduce ok: 4 ranks"), "{out}");
}

#[test]
fn mpi_pingpong_runs_over_mtl_ofi_on_verbs_ofi_rxd() {
    let exe = mpicc(PINGPONG, "pingpong-ofi");
    let out = mpirun(VerbsPath::MtlOfiRxd, &exe, 2, 166, 1000);
    assert!(out.contains("pingpong ok: 1000 round trips"), "{out}");
    eprintln!("mtl ofi verbs;ofi_rxd: {}", out.trim());
}

#[test]
fn mpi_allreduce_over_four_ranks_runs_over_mtl_ofi_on_verbs_ofi_rxd() {
    let exe = mpicc(ALLREDUCE, "allreduce-ofi");
    let out = mpirun(VerbsPath::MtlOfiRxd, &exe, 4, 168, 50);
    assert!(out.contains("allreduce ok: 4 ranks"), "{out}");
}

#[test]
fn mpi_pingpong_runs_over_mtl_ofi_on_verbs_ofi_rxm() {
    let exe = mpicc(PINGPONG, "pingpong-rxm");
    let out = mpirun(VerbsPath::MtlOfiRxm, &exe, 2, 190, 1000);
    assert!(out.contains("pingpong ok: 1000 round trips"), "{out}");
    eprintln!("mtl ofi verbs;ofi_rxm: {}", out.trim());
}

#[test]
fn mpi_allreduce_over_four_ranks_runs_over_mtl_ofi_on_verbs_ofi_rxm() {
    let exe = mpicc(ALLREDUCE, "allreduce-rxm");
    let out = mpirun(VerbsPath::MtlOfiRxm, &exe, 4, 192, 50);
    assert!(out.contains("allreduce ok: 4 ranks"), "{out}");
}
