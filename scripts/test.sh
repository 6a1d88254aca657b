#!/usr/bin/env bash
# The whole softverbs test suite, from a fresh Debian 12 machine with a Rust toolchain.
# Installs what it needs (Debian packages as root, the nightly Miri component) and fails
# loudly if it cannot; it never skips a stage silently.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }
die() { printf '\nFAILED: %s\n' "$*" >&2; exit 1; }
# Runs a stage under a time limit (minutes), so that a hang fails loudly naming the stage
# instead of eating CI's whole budget. The limits are several times what a stage takes on
# a loaded 2-core machine; the whole suite takes about 30 minutes there.
limit() {
  local minutes=$1 rc=0
  shift
  timeout --kill-after=30s "${minutes}m" "$@" || rc=$?
  case $rc in
    0) ;;
    124 | 137) die "stage exceeded its ${minutes}-minute limit (a hang?): $*" ;;
    *) die "stage failed (exit $rc): $*" ;;
  esac
}

# Debian packages: verbs.h and the real libibverbs (layout and status-string tests), the man
# pages the tests cite, the unmodified programs the drop-in must load (ibverbs-utils,
# perftest), a C compiler, binutils (objdump checks symbol versions), tshark (decodes our
# RoCEv2 captures) and wireshark-common (editcap writes the pcapng our reader must read),
# iproute2 and iptables (two hosts as network namespaces, packet loss), valgrind and
# python3-pyverbs (drop-in C programs under memcheck; pyverbs on the drop-in), cmake and
# libclang-dev (the `ibverbs` crate's build script configures its vendored rdma-core and
# runs bindgen: its example runs on the drop-in); librdmacm-dev and rdmacm-utils (the
# connection manager's header, man pages and programs: rping, ucmatose, udaddy, cmtime, …,
# on the drop-in librdmacm.so.1); the stacks that must run on softverbs: UCX (ucx-utils),
# Open MPI (openmpi-bin, libopenmpi-dev: mpirun, mpicc) and libfabric (libfabric-bin);
# strace (counts the system calls a CQ arm makes).
packages=(libibverbs-dev rdma-core ibverbs-utils perftest gcc libc6-dev pkg-config binutils
  tshark wireshark-common iproute2 iptables valgrind python3-pyverbs cmake libclang-dev
  librdmacm-dev rdmacm-utils ucx-utils openmpi-bin libopenmpi-dev libfabric-bin strace)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  step "installing Debian packages: ${missing[*]}"
  [ "$(id -u)" = 0 ] || die "need root to apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed"
  apt-get install -y -qq "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]} failed"
fi
[ -f /usr/include/infiniband/verbs.h ] || die "verbs.h missing after installing libibverbs-dev"
# The two-host tests make network namespaces: they need root, as CI runs.
[ "$(id -u)" = 0 ] || die "the suite needs root (network namespaces for the two-host tests)"

step "toolchains"
rustup show active-toolchain
rustup toolchain list | grep -q '^nightly' || die "no nightly toolchain for Miri (rustup toolchain install nightly)"
rustup component add --toolchain nightly miri rust-src >/dev/null 2>&1 \
  || die "cannot add the miri component to the nightly toolchain"

export CARGO_TERM_COLOR=never

step "format"
limit 5 cargo fmt --all -- --check

step "clippy"
limit 20 cargo clippy --locked --workspace --all-features --all-targets -- -D warnings

step "docs"
RUSTDOCFLAGS="-D warnings" limit 15 cargo doc --locked --workspace --all-features --no-deps

step "packages (the library crates as a registry would take them)"
# The crates a Rust user depends on must package: metadata, versions on the internal
# dependencies, every file inside the crate. --allow-dirty: a developer's uncommitted work
# packages too (CI's clone is clean either way).
limit 5 cargo package --locked --no-verify --allow-dirty \
  -p softverbs-wire -p softverbs-cq -p softverbs-cm -p softverbs-proto -p softverbs-device -p softverbs

step "tests"
limit 30 cargo test --locked --workspace --all-features

step "the drop-in's program suites again over UDP (the tests step ran them on the shared-memory path)"
# Two processes of one host talk through shared memory by default; SOFTVERBS_NETWORK=udp
# puts the same unmodified programs on RoCEv2 over UDP, so both paths run every program.
SOFTVERBS_NETWORK=udp limit 15 cargo test --locked --all-features -p softverbs-capi \
  --test verbs_programs --test programs --test c_programs
SOFTVERBS_NETWORK=udp limit 10 cargo test --locked --all-features -p softverbs-rdmacm --test programs

step "examples (each runs and checks its own result)"
# Every example of every crate, found by name so that a new one runs without a line here;
# each exits non-zero when a check fails. Built as the tests were (--all-features).
for example in crates/*/examples/*.rs; do
  crate=$(basename "$(dirname "$(dirname "$example")")")
  limit 5 cargo run --locked --all-features -q -p "$crate" --example "$(basename "$example" .rs)"
done

step "loom models (softverbs-cq)"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  limit 15 cargo test --locked --release -p softverbs-cq --test loom

step "Miri (softverbs-cq ring, small counts)"
MIRIFLAGS="${MIRIFLAGS:--Zmiri-strict-provenance}" CARGO_TARGET_DIR=target/miri \
  limit 15 cargo +nightly miri test --locked -p softverbs-cq --test miri_ring

step "Miri (softverbs-device's shared-memory ring between processes)"
MIRIFLAGS="${MIRIFLAGS:--Zmiri-strict-provenance}" CARGO_TARGET_DIR=target/miri \
  limit 15 cargo +nightly miri test --locked -p softverbs-device --lib shm::ring

step "benchmarks compile and run once (smoke; figures come from scripts/bench.sh)"
# Without the release profile's whole-program optimisation: this stage checks that every
# benchmark builds and runs, not how fast (about a minute less to build on two cores).
CARGO_PROFILE_BENCH_LTO=false CARGO_PROFILE_BENCH_CODEGEN_UNITS=16 \
  limit 20 cargo bench --locked --workspace -- --test

step "interop with the kernel's Soft-RoCE (rdma_rxe in a QEMU guest; interop/README.md)"
limit 25 scripts/interop.sh

echo
echo "all stages passed"
