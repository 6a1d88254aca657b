#!/usr/bin/env bash
# softverbs against the Linux kernel's Soft-RoCE (rdma_rxe) on one wire.
#
# Unmodified ibv_{rc,uc,ud}_pingpong and perftest programs run with one side on kernel rxe
# in a QEMU guest and the other on the softverbs drop-in libibverbs.so.1 on the host, in
# both roles, at MTU 4096 and 1024, then the RDMA CM programs (rping, ucmatose, udaddy:
# the kernel's rdma_cm against the drop-in librdmacm.so.1), memory windows (our own
# interop/programs/mw_peer.c, built here), then RC and the CM under 5 % packet loss; a
# capture of the tap has its every ICRC checked. See interop/README.md.
#
# Run as root (network namespace, tap, iptables, apt-get for the guest image's tools).
# Nothing leaves the machine: the guest's only NIC is a tap inside a network namespace
# made here (host 10.99.0.1 and fd99::1, guest 10.99.0.2 and fd99::2) and removed on exit.
#
#   scripts/interop.sh [driver options]      e.g. --only 'mtu1024/rc_' --iters 50
#
# env: SOFTVERBS_INTEROP_OUT (default target/interop: logs, capture, summary.txt),
#      SOFTVERBS_RXE_CACHE (default /var/tmp/softverbs-rxe: the guest image, reused while
#      interop/build-image.sh and interop/guest/init are unchanged),
#      SOFTVERBS_INTEROP_TIMEOUT (default 1200: the whole driver run, in seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
step() { printf '[interop.sh +%ss] %s\n' "$((SECONDS - T0))" "$*"; }
die() { printf 'interop FAILED: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (network namespace, tap device, iptables, apt-get)"

# Host tools: the programs run on the drop-in, the capture and its checks, the namespace,
# and gcc with libibverbs-dev for our own verbs programs (interop/programs).
need=()
for p in ibverbs-utils perftest rdmacm-utils iproute2 iptables tshark python3 gcc libibverbs-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    step "apt-get install ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null \
        || die "apt-get install ${need[*]}"
fi

# The CM cases need the drop-in librdmacm.so.1 (crate softverbs-rdmacm): without it the
# stage cannot run them, and says so rather than skipping them.
[ -f crates/softverbs-rdmacm/Cargo.toml ] \
    || die "crates/softverbs-rdmacm is missing: the CM cases need the drop-in librdmacm.so.1"
step "building the drop-ins (libibverbs.so.1, librdmacm.so.1) and the softverbs command (release)"
cargo build --release --locked -q -p softverbs-capi -p softverbs-rdmacm -p softverbs-cli
TARGET=${CARGO_TARGET_DIR:-target}/release
[ -f "$TARGET/libsoftverbs_capi.so" ] && [ -x "$TARGET/softverbs" ] || die "no build output in $TARGET"
[ -f "$TARGET/libsoftverbs_rdmacm.so" ] || die "no $TARGET/libsoftverbs_rdmacm.so (the drop-in librdmacm.so.1)"
TARGET=$(cd "$TARGET" && pwd)

step "guest image (interop/build-image.sh)"
CACHE=${SOFTVERBS_RXE_CACHE:-/var/tmp/softverbs-rxe}
IMG=$(SOFTVERBS_RXE_CACHE=$CACHE bash interop/build-image.sh | tail -1)
[ -f "$IMG/complete" ] || die "no guest image"

OUT=${SOFTVERBS_INTEROP_OUT:-target/interop}
rm -rf "$OUT"; mkdir -p "$OUT/lib"; OUT=$(cd "$OUT" && pwd)
ln -s "$TARGET/libsoftverbs_capi.so" "$OUT/lib/libibverbs.so.1"
ln -s "$TARGET/libsoftverbs_rdmacm.so" "$OUT/lib/librdmacm.so.1"

# Our own verbs program (memory windows), built here against the host's libibverbs-dev
# (rdma-core 44, as the guest's libibverbs1) and linked to libibverbs.so.1 only: the same
# binary runs in the guest (from the 9p share) on rxe and here on the drop-in.
step "building interop/programs/mw_peer.c (gcc, libibverbs-dev)"
mkdir -p "$OUT/bin"
gcc -O2 -Wall -Wextra -Werror -o "$OUT/bin/mw_peer" interop/programs/mw_peer.c -libverbs \
    || die "gcc interop/programs/mw_peer.c"

NS=svrxe$$
TAP=svtap0
cleanup() {
    ip netns pids "$NS" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$NS" 2>/dev/null || true
}
trap cleanup EXIT
step "network namespace $NS: tap $TAP 10.99.0.1/24 and fd99::1/64, MTU 9000 (the guest: .2)"
ip netns add "$NS"
ip netns exec "$NS" sysctl -q -w net.ipv6.conf.all.disable_ipv6=0 net.ipv6.conf.default.disable_ipv6=0
ip -n "$NS" link set lo up
ip -n "$NS" tuntap add dev "$TAP" mode tap
ip -n "$NS" addr add 10.99.0.1/24 dev "$TAP"
ip -n "$NS" addr add fd99::1/64 dev "$TAP" nodad
ip -n "$NS" link set "$TAP" mtu 9000 up

step "running the interop matrix (results in $OUT)"
set +e
timeout -k 10 "${SOFTVERBS_INTEROP_TIMEOUT:-1200}" ip netns exec "$NS" \
    python3 interop/host/driver.py --image "$IMG" --qemu-env "$CACHE/qemu.env" \
    --lib "$OUT/lib" --cli "$TARGET/softverbs" --mw-peer "$OUT/bin/mw_peer" --out "$OUT" \
    --tap "$TAP" "$@"
rc=$?
set -e
[ $rc = 124 ] && echo "interop FAILED: the driver ran out of time (SOFTVERBS_INTEROP_TIMEOUT)"
step "done (exit $rc); summary: $OUT/summary.txt"
exit $rc
