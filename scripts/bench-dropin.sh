#!/usr/bin/env bash
# The drop-in benchmark of issue 5: unmodified perftest programs on the drop-in
# libibverbs.so.1 (crate softverbs-capi), beside the same workload through the safe Rust
# API (softverbs perf, the same device underneath) and beside the kernel's bare UDP, all
# measured in the same run:
#   1. ib_send_lat -s 8: RC 8-byte send ping-pong round trip (median, p99), against
#      softverbs perf send lat -s 8 (the C boundary's cost)          target <= 1.1x
#      and a busy-polled 8-byte UDP ping-pong of udp-baseline (the floor)
#   2. ib_write_bw -s 65536 and -s 4096, tx-depth 128: RDMA write bandwidth, against
#      softverbs perf write bw -t 128                                 target >= 1/1.1x
#      and the best UDP stream two processes reach (udp-baseline)
#   3. ib_send_lat -s 8 -e: the round trip when both sides wait for completion events,
#      against the same program busy polling (row 1)                 target <= 1.5x
#      and, for scale, the kernel's own: a UDP ping-pong of 14-byte messages (sockperf)
#      sleeping in recvfrom against the same busy polling (--nonblocked): what waking a
#      sleeping thread for every message costs on this machine
#   4. ib_send_lat -s 8 -R: the same program connected through the RDMA CM (the drop-in
#      librdmacm.so.1), against row 1: connection set-up aside, the data path must be
#      the same                                                     target <= 1.1x
#   5. ib_write_bw -s 4096 with 512 and 2048 QPs at once, against the same program with
#      8 QPs and as many messages in all: load without collapse     target >= 0.8x
#      (the retransmitted packets of each run are printed beside the table)
#   6. ib_send_lat -s 8 on the shared-memory path between the two processes (the device's
#      default network, SOFTVERBS_NETWORK unset) and over UDP (row 1), each against UCX's
#      tag_lat with UCX_TLS=posix,cma (UCX's own shared memory) measured in the same run:
#      round trip (median; p99 beside row 1's)       target <= 2 us on a quiet machine
#   7. cmtime -c 10 (rdmacm-utils) on the drop-ins: ten connections set up at once through
#      the RDMA CM, the time their connect step took, on the shared-memory path against
#      the same over UDP: what preparing a connection's shared-memory route costs
#   8. UCX on the drop-in: ucx_perftest -t tag_lat -s 8 over rc_verbs (ud_verbs for
#      wire-up, UCX_TLS=rc_verbs,ud_verbs:aux) under softverbs run --dev-node, on the
#      shared-memory path: round trip (median and average), against ib_send_lat on the
#      same path (row 6: what UCX's own layers add) and against UCX posix,cma (row 6)
# Every other row sets SOFTVERBS_NETWORK=udp, so it measures RoCEv2 over UDP whatever the
# device's default is; until the device has a shared-memory path, row 6 measures that same
# UDP path.
#
# Usage: scripts/bench-dropin.sh [--json] [--reps N]
#   --json    print the results as one JSON document on stdout (progress goes to stderr)
#   --reps N  repetitions of every measurement, medians reported (default 3)
#
# Run by hand (as root if perftest or ucx_perftest is missing: they are installed with
# apt-get). Every pair
# is two processes over 127.0.0.0/8, the server pinned to CPU 0 and the client to CPU 1
# when there are two. The perftest processes load the drop-in through LD_LIBRARY_PATH (a
# directory where target/release/libsoftverbs_capi.so is named libibverbs.so.1), each
# with its own device address SOFTVERBS_ADDR=127.0.0.N (the RoCEv2 port stays 4791 so the
# peers reach each other), N picked free in 127.0.0.241-253 for every pair, the safe
# API's pairs too; a run that did not open the soft device is a failure, never a silent
# measurement of something else.
# Units: latencies in the table are round trips (perftest and softverbs perf print half
# of one); perftest's "MB/sec" are MiB/s (2^20 bytes: format_factor 0x100000, its
# --report_gbits help says "instead of MiB/sec"), converted to Gbit/s (10^9 bits/s) as
# softverbs perf and udp-baseline print. The drop-in and the safe API run the same message
# counts; which of the two goes first alternates between repetitions.
# Takes about 35-50 s per repetition on a quiet 2-core machine. The machines are shared and
# noisy: compare the ratios of one run, not absolute numbers across runs.
set -euo pipefail
cd "$(dirname "$0")/.."

BENCH=bench-dropin
# shellcheck source=scripts/lib/bench-common.sh
. scripts/lib/bench-common.sh
bench_parse_args "$@"

# ---------------------------------------------------------------------------- tools
bench_check_tools
need_pkg ib_send_lat perftest
need_pkg ib_write_bw perftest
need_pkg ucx_perftest ucx-utils
need_pkg sockperf sockperf
need_pkg cmtime rdmacm-utils
bench_build "softverbs, udp-baseline and the drop-ins libibverbs.so.1 and librdmacm.so.1" \
    softverbs-capi softverbs-rdmacm softverbs-cli
CDYLIB="$TARGET_DIR/release/libsoftverbs_capi.so"
CMLIB="$TARGET_DIR/release/libsoftverbs_rdmacm.so"
[ -f "$CDYLIB" ] || die "the drop-in $CDYLIB was not built"
[ -f "$CMLIB" ] || die "the drop-in $CMLIB was not built"

# ---------------------------------------------------------------------------- plumbing
bench_setup
# The device's environment is the benchmark's to set: an inherited address, capture or
# fault injection would break or distort the runs, an inherited network would put every
# pair on it (each pair's is NET_ENV's, as on_shared_memory sets it).
unset SOFTVERBS_ADDR SOFTVERBS_PCAP SOFTVERBS_FAULTS SOFTVERBS_STATS SOFTVERBS_NETWORK

DROPIN_LIB="$WORK/lib"
mkdir "$DROPIN_LIB"
ln -s "$CDYLIB" "$DROPIN_LIB/libibverbs.so.1"
ln -s "$CMLIB" "$DROPIN_LIB/librdmacm.so.1"

# pick_addrs: two device addresses 127.0.0.N whose RoCEv2 port (UDP 4791) nothing holds
# now, from 127.0.0.241-253 (the test suites bind fixed addresses up to .240 and .254),
# as `env SOFTVERBS_ADDR=...` prefixes in DEV_ENV_S (server) and DEV_ENV_C (client),
# which sv_xp_lat and sv_xp_bw use too.
pick_addrs() {
    local used n found=()
    used=" $(ss -H -lnu 'sport = :4791' 2> /dev/null | awk '{print $4}' | tr '\n' ' ')"
    case "$used" in *" 0.0.0.0:4791 "* | *" *:4791 "* | *" [::]:4791 "*)
        log "    UDP port 4791 is held on every address:$used"
        return 1
        ;;
    esac
    for n in $(seq 241 253); do
        case "$used" in *" 127.0.0.$n:4791 "*) continue ;; esac
        found+=("127.0.0.$n")
        [ "${#found[@]}" -lt 2 ] || break
    done
    if [ "${#found[@]}" -lt 2 ]; then
        log "    no two free 127.0.0.N:4791 left in 127.0.0.241-253"
        return 1
    fi
    SERVER_IP=${found[0]}
    DEV_ENV_S=(env "SOFTVERBS_ADDR=${found[0]}")
    DEV_ENV_C=(env "SOFTVERBS_ADDR=${found[1]}")
}
# with_addrs CMD...: CMD with fresh device addresses.
with_addrs() {
    pick_addrs || return 1
    "$@"
}

# dropin_pair NAME PROGRAM ARG...: PROGRAM's server and client on the drop-in (the
# client's device counters in $WORK/NAME.stats), over UDP unless on_shared_memory; fails
# unless the client ran on the soft device.
dropin_pair() {
    local name="$1" prog="$2"
    shift 2
    next_port
    pick_addrs || return 1
    local lib="LD_LIBRARY_PATH=$DROPIN_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    pair "$name" "$PORT" -- "${NET_ENV[@]}" "${DEV_ENV_S[@]}" "$lib" "$prog" "$@" -p "$PORT" \
        -- "${NET_ENV[@]}" "${DEV_ENV_C[@]}" "$lib" SOFTVERBS_STATS="$WORK/$name.stats" "$prog" "$@" -p "$PORT" "$SERVER_IP" || return 1
    if ! grep -Eq 'Device +: softverbs0' "$WORK/$name.out"; then
        log "    $name did not run on the drop-in's device softverbs0:"
        sed 's/^/      client: /' "$WORK/$name.out" "$WORK/$name.err" >&2
        return 1
    fi
}

# perftest_col FILE COLUMN [FACTOR]: COLUMN of the first result line of a perftest report,
# times FACTOR. COLUMN is a header as perftest prints it ("t_typical[usec]",
# "BW average[MB/sec]"), so a report in other units fails instead of being misread.
perftest_col() {
    "$PY" - "$1" "$2" "${3:-1}" << 'EOF'
import re, sys
path, column, factor = sys.argv[1], sys.argv[2], float(sys.argv[3])
lines = open(path).read().splitlines()
for i, line in enumerate(lines):
    if line.strip().startswith("#bytes"):
        names = re.findall(r"\S+(?: (?:peak|average|percentile)\S*)?", line)
        values = next((l.split() for l in lines[i + 1:] if re.match(r"\s*\d", l)), [])
        if column in names and len(values) == len(names):
            print(float(values[names.index(column)]) * factor)
            sys.exit(0)
print(f"no column {column!r} in {path}", file=sys.stderr)
sys.exit(1)
EOF
}

# The drop-in's retransmissions (SOFTVERBS_STATS report of the client's device).
dropin_retrans() { sed -n 's/.* retransmitted_packets=\([0-9]*\).*/\1/p' "$WORK/$1.stats" | tail -1; }

LAT_ITERS=20000 # as sv_xp_lat (softverbs perf send lat -n 20000)
SIZES=(65536 4096)
# Messages per size, the same for the drop-in and the safe API: about a second each.
bw_iters() { case "$1" in 65536) echo 5000 ;; *) echo 20000 ;; esac }
MIB_TO_GBIT=0.008388608 # 2^20 * 8 / 10^9

# Over UDP; on_shared_memory dropin_lat: the same on the device's default path, with
# shm_dropin_* keys.
dropin_lat() {
    dropin_pair dropin_lat ib_send_lat -s 8 -n "$LAT_ITERS" -F || return 1
    record "${XP_KEY}dropin_lat_rtt_med" "$(perftest_col "$WORK/dropin_lat.out" 't_typical[usec]' 2)" || return 1
    record "${XP_KEY}dropin_lat_rtt_p99" "$(perftest_col "$WORK/dropin_lat.out" '99% percentile[usec]' 2)" || return 1
}
# The same connected through the RDMA CM (-R): the client resolves the server device's
# address and connects with the CM's MADs on QP1 instead of perftest's TCP exchange.
# The server's device is up once it holds SERVER_IP:4791 (up to 10 s); its rdma_listen
# follows at once, given half a second.
cm_ready() {
    local _
    for _ in $(seq 100); do
        if ss -H -lnu "sport = :4791" 2> /dev/null | grep -q "$SERVER_IP:4791"; then
            sleep 0.5
            return 0
        fi
        sleep 0.1
    done
    return 1
}
dropin_lat_cm() {
    local rc=0
    PAIR_READY=cm_ready
    dropin_pair dropin_lat_cm ib_send_lat -s 8 -n "$LAT_ITERS" -F -R || rc=1
    PAIR_READY=""
    [ "$rc" = 0 ] || return 1
    record dropin_lat_cm_rtt_med "$(perftest_col "$WORK/dropin_lat_cm.out" 't_typical[usec]' 2)" || return 1
}
# The same with -e: each side sleeps in ibv_get_cq_event (completion channel) for every
# completion instead of busy polling.
dropin_lat_ev() {
    dropin_pair dropin_lat_ev ib_send_lat -s 8 -n "$LAT_ITERS" -F -e || return 1
    record dropin_lat_ev_rtt_med "$(perftest_col "$WORK/dropin_lat_ev.out" 't_typical[usec]' 2)" || return 1
}
# stopped_pair NAME READY SERVER... -- CLIENT...: a pair whose server serves until it is
# stopped (sockperf's, cmtime's): the server's output in $WORK/NAME.srv, the client's in
# $WORK/NAME.out and NAME.err; `READY $PORT` returns once the server listens, and the
# server is stopped once the client is done. Fails, with what they said, unless the
# client succeeded.
stopped_pair() {
    local name="$1" ready="$2" srv=() rc=0
    shift 2
    while [ "$1" != "--" ]; do
        srv+=("$1")
        shift
    done
    shift
    timeout 90 "${PIN_S[@]}" "${srv[@]}" > "$WORK/$name.srv" 2>&1 &
    SERVER_PID=$!
    if "$ready" "$PORT"; then
        timeout 90 "${PIN_C[@]}" "$@" > "$WORK/$name.out" 2> "$WORK/$name.err" &
        CLIENT_PID=$!
        wait "$CLIENT_PID" || rc=$?
        CLIENT_PID=""
    else
        log "    $name: the server never listened on port $PORT:"
        rc=1
    fi
    kill "$SERVER_PID" 2> /dev/null || true
    wait "$SERVER_PID" 2> /dev/null || true
    SERVER_PID=""
    if [ "$rc" != 0 ]; then
        log "    $name failed (client exit $rc):"
        cat "$WORK/$name.out" "$WORK/$name.err" 2> /dev/null | sed 's/^/      client: /' >&2
        sed 's/^/      server: /' "$WORK/$name.srv" >&2
        return 1
    fi
}
# UCX's tag_lat over rc_verbs on the drop-in (UCX uses a verbs device only where
# /dev/infiniband/softverbs0 exists: softverbs run --dev-node gives it one), over UDP or
# on_shared_memory: the median and the average round trip. UCX keeps the CQs of its
# ud_verbs transport armed for its async thread while its main thread polls.
ucx_dropin_lat() {
    next_port
    pick_addrs || return 1
    local -a ucx_env=(env UCX_TLS=rc_verbs,ud_verbs:aux UCX_NET_DEVICES=softverbs0:1 UCX_WARN_UNUSED_ENV_VARS=n)
    # No `--` before the program: `pair` splits the server's command from the client's at
    # it (softverbs run takes the first word that is not its option as the program).
    local -a run=("$SV" run --dev-node --lib "$CDYLIB")
    pair ucx_dropin "$PORT" -- "${NET_ENV[@]}" "${DEV_ENV_S[@]}" "${ucx_env[@]}" "${run[@]}" ucx_perftest -p "$PORT" \
        -- "${NET_ENV[@]}" "${DEV_ENV_C[@]}" "${ucx_env[@]}" "${run[@]}" ucx_perftest 127.0.0.1 -p "$PORT" \
        -t tag_lat -s 8 -n "$LAT_ITERS" -w "$((LAT_ITERS / 10))" -f -v || return 1
    record "${XP_KEY}ucx_dropin_lat_rtt_med" "$("$PY" -c 'import sys; print(2*float(sys.argv[1]))' "$(ucx_field ucx_dropin 2)")" || return 1
    record "${XP_KEY}ucx_dropin_lat_rtt_avg" "$("$PY" -c 'import sys; print(2*float(sys.argv[1]))' "$(ucx_field ucx_dropin 3)")" || return 1
}
# cmtime's connect step for ten connections at once (ms), over UDP or on_shared_memory.
dropin_cmtime() {
    next_port
    pick_addrs || return 1
    local lib="LD_LIBRARY_PATH=$DROPIN_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    stopped_pair cmtime cm_ready \
        "${NET_ENV[@]}" "${DEV_ENV_S[@]}" "$lib" cmtime -b "$SERVER_IP" -p "$PORT" -c 10 \
        -- "${NET_ENV[@]}" "${DEV_ENV_C[@]}" "$lib" cmtime -s "$SERVER_IP" -p "$PORT" -c 10 || return 1
    # "connect      :   total ms   max ms   min us   us / conn"
    record "${XP_KEY}dropin_cm_connect_ms" "$(awk '$1 == "connect" && $2 == ":" {print $3}' "$WORK/cmtime.out")" || return 1
}
# The kernel's UDP ping-pong (sockperf, 14-byte messages, 3 s), each side sleeping in
# recvfrom, or busy polling with --nonblocked: KEY [--nonblocked]. sockperf prints one-way
# latencies; recorded as round trips. Its server runs until it is stopped.
kernel_udp_pp() {
    local key="$1"
    shift
    next_port
    stopped_pair sockperf wait_port sockperf server -i 127.0.0.1 -p "$PORT" "$@" \
        -- sockperf ping-pong -i 127.0.0.1 -p "$PORT" -t 3 -m 14 "$@" || return 1
    local one_way
    one_way="$(sed -n 's/.*percentile 50\.000 = *\([0-9.]*\).*/\1/p' "$WORK/sockperf.out" | head -n 1)"
    record "$key" "$("$PY" -c 'import sys; print(2 * float(sys.argv[1]))' "$one_way")" || return 1
}
dropin_bw() { # SIZE
    dropin_pair dropin_bw ib_write_bw -s "$1" -n "$(bw_iters "$1")" -t 128 -F || return 1
    record "dropin_bw_$1" "$(perftest_col "$WORK/dropin_bw.out" 'BW average[MB/sec]' "$MIB_TO_GBIT")" || return 1
    note "dropin_bw_retrans_$1" "$(dropin_retrans dropin_bw)"
}
# The same 4 KiB writes spread over QPS queue pairs at once, as many messages in all
# (perftest's -n counts per QP): what the device has in flight must stay within what the
# peer absorbs whatever the number of QPs.
LOAD_MESSAGES=163840
dropin_load() { # QPS
    dropin_pair "dropin_load_$1" ib_write_bw -s 4096 -q "$1" -n "$((LOAD_MESSAGES / $1))" -F || return 1
    record "dropin_load_$1" "$(perftest_col "$WORK/dropin_load_$1.out" 'BW average[MB/sec]' "$MIB_TO_GBIT")" || return 1
    note "dropin_load_retrans_$1" "$(dropin_retrans "dropin_load_$1")"
}

# ---------------------------------------------------------------------------- run
bench_start
log "    drop-in: $DROPIN_LIB/libibverbs.so.1 -> $CDYLIB"

for rep in $(seq "$REPS"); do
    bench_rep "$rep"
    # Odd repetitions run the drop-in first, even ones the safe API: neither always
    # inherits the other's warm caches or a load change.
    if [ $((rep % 2)) = 1 ]; then first=dropin; else first=safe; fi
    log "  1. 8-byte send latency: drop-in / safe API / bare UDP ping-pong"
    if [ "$first" = dropin ]; then try "drop-in ib_send_lat" dropin_lat; fi
    try "safe API send lat" with_addrs sv_xp_lat
    if [ "$first" = safe ]; then try "drop-in ib_send_lat" dropin_lat; fi
    try "UDP ping-pong" udp_pp
    log "  2. write bandwidth: drop-in / safe API / UDP stream"
    for s in "${SIZES[@]}"; do
        if [ "$first" = dropin ]; then try "drop-in ib_write_bw $s" dropin_bw "$s"; fi
        try "safe API write bw $s" with_addrs sv_xp_bw "$s" "$(bw_iters "$s")"
        if [ "$first" = safe ]; then try "drop-in ib_write_bw $s" dropin_bw "$s"; fi
    done
    try "UDP stream" udp_stream_best
    log "  3. 8-byte send latency sleeping on completion events (-e)"
    try "drop-in ib_send_lat -e" dropin_lat_ev
    try "kernel UDP ping-pong, sleeping (sockperf)" kernel_udp_pp kernel_udp_sleeping_rtt_med
    try "kernel UDP ping-pong, busy polling (sockperf --nonblocked)" kernel_udp_pp kernel_udp_polling_rtt_med --nonblocked
    log "  4. 8-byte send latency connected through the RDMA CM (-R)"
    try "drop-in ib_send_lat -R" dropin_lat_cm
    log "  5. 4 KiB write bandwidth on 8, 512 and 2048 QPs at once"
    for q in 8 512 2048; do try "drop-in ib_write_bw -q $q" dropin_load "$q"; done
    log "  6. 8-byte send latency on the shared-memory path (SOFTVERBS_NETWORK unset) / UCX posix,cma"
    try "drop-in ib_send_lat, shared memory" on_shared_memory dropin_lat
    try "ucx posix,cma tag_lat" ucx_lat ucx_shm_lat_rtt posix,cma
    log "  7. connection set-up through the RDMA CM (cmtime -c 10): shared memory / UDP"
    try "drop-in cmtime, shared memory" on_shared_memory dropin_cmtime
    try "drop-in cmtime, UDP" dropin_cmtime
    log "  8. UCX on the drop-in: tag_lat over rc_verbs, shared memory"
    try "ucx rc_verbs tag_lat on the drop-in, shared memory" on_shared_memory ucx_dropin_lat
done
bench_done

# ---------------------------------------------------------------------------- table
bench_report << 'EOF'
SUBJECT = "drop_in"
SIZES = [65536, 4096]
SAFE_LAT = "softverbs perf send lat (safe Rust API)"
SAFE_BW = "softverbs perf write bw -t 128 (safe Rust API)"
UDP_PP = "bare UDP ping-pong, busy-poll"
UDP_STREAM = f"UDP stream, best datagram size (per run: {best_dgram} B)"
row("1. send 8 B RTT median vs safe API", "dropin_lat_rtt_med", "sv_xp_lat_rtt_med", "us", True, ("ratio<=", 1.1), SAFE_LAT)
row("1. send 8 B RTT median vs bare UDP", "dropin_lat_rtt_med", "udp_pp_rtt_med", "us", True, None, UDP_PP)
row("1. send 8 B RTT p99 vs safe API", "dropin_lat_rtt_p99", "sv_xp_lat_rtt_p99", "us", True, None, SAFE_LAT)
row("1. send 8 B RTT p99 vs bare UDP", "dropin_lat_rtt_p99", "udp_pp_rtt_p99", "us", True, None, UDP_PP)
for s in SIZES:
    row(f"2. write bw {size_name(s)} vs safe API", f"dropin_bw_{s}", f"sv_xp_bw_{s}", "Gbit/s", False, ("ratio>=", 1 / 1.1), SAFE_BW)
    row(f"2. write bw {size_name(s)} vs UDP stream", f"dropin_bw_{s}", "udp_stream_best", "Gbit/s", False, None, UDP_STREAM)
row("3. send 8 B RTT median, -e vs polling", "dropin_lat_ev_rtt_med", "dropin_lat_rtt_med", "us", True, ("ratio<=", 1.5), "ib_send_lat busy-polling (drop-in, row 1)")
row("3. kernel UDP 14 B RTT median, sleeping vs polling", "kernel_udp_sleeping_rtt_med", "kernel_udp_polling_rtt_med", "us", True, None, "sockperf ping-pong --nonblocked (the same, busy polling)")
row("4. send 8 B RTT median, -R vs TCP set-up", "dropin_lat_cm_rtt_med", "dropin_lat_rtt_med", "us", True, ("ratio<=", 1.1), "ib_send_lat set up over TCP (drop-in, row 1)")
for q in (512, 2048):
    row(f"5. write bw 4 KiB, {q} QPs vs 8 QPs", f"dropin_load_{q}", "dropin_load_8", "Gbit/s", False, ("ratio>=", 0.8), "ib_write_bw -q 8, as many 4 KiB messages")
UCX_SHM = "UCX posix,cma tag_lat"
row("6. send 8 B RTT median, shared memory vs UCX posix,cma", "shm_dropin_lat_rtt_med", "ucx_shm_lat_rtt", "us", True, ("abs<=", 2.0), UCX_SHM)
row("6. send 8 B RTT median, UDP vs UCX posix,cma", "dropin_lat_rtt_med", "ucx_shm_lat_rtt", "us", True, None, UCX_SHM)
row("6. send 8 B RTT p99, shared memory vs UDP", "shm_dropin_lat_rtt_p99", "dropin_lat_rtt_p99", "us", True, None, "ib_send_lat over UDP (drop-in, row 1)")
row("7. connect of 10 ids (cmtime), shared memory vs UDP", "shm_dropin_cm_connect_ms", "dropin_cm_connect_ms", "ms", True, None, "cmtime -c 10 over UDP (SOFTVERBS_NETWORK=udp)")
UCX_DROPIN = "ib_send_lat, shared memory (drop-in, row 6)"
row("8. UCX rc_verbs tag_lat 8 B RTT median vs ib_send_lat", "shm_ucx_dropin_lat_rtt_med", "shm_dropin_lat_rtt_med", "us", True, None, UCX_DROPIN)
row("8. UCX rc_verbs tag_lat 8 B RTT average vs ib_send_lat", "shm_ucx_dropin_lat_rtt_avg", "shm_dropin_lat_rtt_med", "us", True, None, UCX_DROPIN)
row("8. UCX rc_verbs tag_lat 8 B RTT median vs UCX posix,cma", "shm_ucx_dropin_lat_rtt_med", "ucx_shm_lat_rtt", "us", True, None, UCX_SHM)

def ratio(a, b):
    return med[a] / med[b] if a in med and med.get(b) else None
retrans = {side: {str(s): samples.get(f"{key}_{s}", []) for s in SIZES}
           for side, key in [("drop_in", "dropin_bw_retrans"), ("safe_api", "sv_xp_bw_retrans")]}
retrans["drop_in_load"] = {f"{q}_qps": samples.get(f"dropin_load_retrans_{q}", []) for q in (8, 512, 2048)}
safe_vs_floor = {"send_8_rtt_median": ratio("sv_xp_lat_rtt_med", "udp_pp_rtt_med")}
safe_vs_floor.update({f"write_bw_{s}": ratio(f"sv_xp_bw_{s}", "udp_stream_best") for s in SIZES})

if as_json:
    print(json.dumps({"repetitions": reps, "statistic": "median", "best_udp_datagram": best_dgram,
                      "failed_measurements": failed, "rows": rows,
                      "safe_api_over_udp": safe_vs_floor,
                      "retransmitted_packets_bw": retrans}, indent=2))
    sys.exit(0)

print_table(f"Medians of {reps} runs; latencies are round trips; ratio = drop-in / baseline.")
print("drop-in = unmodified perftest (ib_send_lat -s 8 -n 20000; ib_write_bw -t 128, -n 5000 at 64 KiB, 20000 at 4 KiB) "
      "on libibverbs.so.1 = libsoftverbs_capi.so; safe API = softverbs perf --server/--client, same sizes and counts;")
print("bare UDP = udp-baseline pingpong (two processes, non-blocking, busy-polled) / udp-baseline stream "
      f"(best of 16384/32768/65507-byte datagrams per run: {best_dgram}; goodput at the receiver).")
print("Rows 1-5 run with SOFTVERBS_NETWORK=udp; row 6's shared memory with SOFTVERBS_NETWORK unset (the device's default), "
      "against ucx_perftest -t tag_lat -s 8 with UCX_TLS=posix,cma (median round trip); row 7: cmtime -c 10 on both drop-ins, "
      "the connect step's total for the ten connections, with SOFTVERBS_NETWORK unset and =udp; "
      "row 8: ucx_perftest -t tag_lat -s 8 with UCX_TLS=rc_verbs,ud_verbs:aux on the drop-in under softverbs run --dev-node, "
      "SOFTVERBS_NETWORK unset (median and average round trip).")
labels = {"send_8_rtt_median": "send 8 B RTT median"} | {f"write_bw_{s}": f"write bw {size_name(s)}" for s in SIZES}
print("For scale, safe API / bare UDP: " + (", ".join(
    f"{labels[k]} {v:.2f}x" for k, v in safe_vs_floor.items() if v is not None) or "n/a") + ".")
lost = {side: {s: int(sum(v)) for s, v in per.items() if sum(v)} for side, per in retrans.items()}
if any(lost.values()):
    print(f"Retransmitted packets in the bandwidth runs (they lower the figures): {lost}")
print_summary()
EOF
