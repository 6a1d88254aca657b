#!/usr/bin/env bash
# The device benchmarks of issue 4, each beside its baseline measured in the same run:
#   1. in-process RC 8-byte send ping-pong round trip (median, p99)        target < 2 us
#   2. cross-process RC 8-byte send ping-pong over UDP loopback against a bare, busy-polled
#      UDP ping-pong of the same 8 bytes between two processes            target <= 1.3x
#   3. RDMA write bandwidth at 64 KiB, 256 KiB, 1 MiB: in-process against memcpy of the
#      same bytes (target >= 0.5x); cross-process against the best UDP throughput two
#      processes reach on loopback (target >= 0.7x)
#   4. the same workloads with ucx_perftest (UCX_TLS=tcp and posix,cma) and fi_pingpong
#      (providers tcp and udp), as the peers a user would pick instead.
#
# Usage: scripts/bench-device.sh [--json] [--reps N]
#   --json    print the results as one JSON document on stdout (progress goes to stderr)
#   --reps N  repetitions of every measurement, medians reported (default 3)
#
# Run by hand, as root (it installs ucx-utils and libfabric-bin with apt-get if they are
# missing). Everything talks over 127.0.0.0/8 only. The two sides of every two-process
# pair are pinned to different CPUs (CPU 0: server, CPU 1: client) when there are two;
# the in-process runs are left unpinned (the device may run a progress thread). All
# latencies in the table are round trips (perftest-like tools print half of that).
# Takes about 1.5-2 minutes on a quiet 2-core machine (up to ~5 under heavy load). The machines are shared and noisy:
# compare the ratios of one run, not absolute numbers across runs.
set -euo pipefail
cd "$(dirname "$0")/.."

JSON=0
REPS=3
while [ $# -gt 0 ]; do
    case "$1" in
        --json) JSON=1 ;;
        --reps)
            REPS="${2:?--reps needs a number}"
            shift
            ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "bench-device: unknown option $1 (see --help)" >&2
            exit 2
            ;;
    esac
    shift
done
case "$REPS" in '' | *[!0-9]* | 0) echo "bench-device: --reps must be a positive number" >&2; exit 2 ;; esac

log() { echo "$@" >&2; }
die() {
    echo "bench-device: $*" >&2
    exit 1
}

# ---------------------------------------------------------------------------- tools
PY="$(command -v python3 || true)"
[ -n "$PY" ] || die "python3 is needed to parse the results"
command -v taskset > /dev/null || die "taskset (util-linux) is needed"
command -v ss > /dev/null || die "ss (iproute2) is needed"

APT_UPDATED=0
need_pkg() { # need_pkg COMMAND PACKAGE
    command -v "$1" > /dev/null && return 0
    [ "$(id -u)" = 0 ] || die "$1 is missing: install the Debian package $2 (apt-get install $2, as root)"
    log "==> installing $2 (for $1)"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >&2; then
        if [ "$APT_UPDATED" = 0 ]; then
            APT_UPDATED=1
            DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 || die "apt-get update failed"
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >&2 || die "cannot install $2"
    fi
    command -v "$1" > /dev/null || die "$2 installed but $1 is still missing"
}
need_pkg ucx_perftest ucx-utils
need_pkg fi_pingpong libfabric-bin

log "==> building softverbs and udp-baseline (release)"
export CARGO_TERM_COLOR=never
cargo build --release --locked -p softverbs-cli >&2 || die "cargo build failed"
TARGET_DIR="$(cargo metadata --format-version 1 --no-deps | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
SV="$TARGET_DIR/release/softverbs"
UB="$TARGET_DIR/release/udp-baseline"
[ -x "$SV" ] && [ -x "$UB" ] || die "built binaries not found in $TARGET_DIR/release"

# ---------------------------------------------------------------------------- plumbing
WORK="$(mktemp -d /tmp/bench-device.XXXXXX)"
RESULTS="$WORK/results.tsv" # key <TAB> value, one line per sample
: > "$RESULTS"
SERVER_PID=""
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2> /dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

if [ "$(nproc)" -ge 2 ]; then
    PIN_S=(taskset -c 0)
    PIN_C=(taskset -c 1)
else
    PIN_S=()
    PIN_C=()
fi
# Ports for the servers' TCP/UDP control or data sockets: one random base per run.
PORT=$((20000 + RANDOM % 20000))
next_port() { PORT=$((PORT + 1)); }

# Keep every transport on loopback: UCX and libfabric otherwise look at every interface.
export UCX_NET_DEVICES=lo UCX_WARN_UNUSED_ENV_VARS=n
export FI_TCP_IFACE=lo FI_UDP_IFACE=lo FI_SOCKETS_IFACE=lo

# record KEY VALUE: one sample; a value that is not a number fails the measurement.
record() {
    if ! "$PY" -c 'import math,sys; v=float(sys.argv[1]); sys.exit(0 if math.isfinite(v) and v > 0 else 1)' "$2" 2> /dev/null; then
        log "    $1: not a measurement: '$2'"
        return 1
    fi
    printf '%s\t%s\n' "$1" "$2" >> "$RESULTS"
}

# Waits until something listens on PORT (TCP or UDP), up to 10 s.
wait_port() {
    local i
    for i in $(seq 100); do
        if ss -H -lntu "sport = :$1" 2> /dev/null | grep -q .; then return 0; fi
        sleep 0.1
    done
    return 1
}

# pair NAME PORT -- SERVER_CMD... -- CLIENT_CMD...: starts the server (CPU 0), waits for
# its port, runs the client (CPU 1) with its stdout in $WORK/NAME.out, the server's in
# $WORK/NAME.srv. Fails (returns 1) if either side fails or times out.
pair() {
    local name="$1" port="$2"
    shift 3
    local srv=() cli=()
    while [ "$1" != "--" ]; do
        srv+=("$1")
        shift
    done
    shift
    cli=("$@")
    timeout 90 "${PIN_S[@]}" "${srv[@]}" > "$WORK/$name.srv" 2> "$WORK/$name.srv.err" &
    SERVER_PID=$!
    if ! wait_port "$port"; then
        kill "$SERVER_PID" 2> /dev/null || true
        wait "$SERVER_PID" 2> /dev/null || true
        SERVER_PID=""
        log "    $name: the server never listened on port $port:"
        sed 's/^/      /' "$WORK/$name.srv.err" >&2
        return 1
    fi
    local rc=0
    timeout 90 "${PIN_C[@]}" "${cli[@]}" > "$WORK/$name.out" 2> "$WORK/$name.err" || rc=$?
    local src=0
    wait "$SERVER_PID" || src=$?
    SERVER_PID=""
    if [ "$rc" != 0 ] || [ "$src" != 0 ]; then
        log "    $name failed (client exit $rc, server exit $src):"
        sed 's/^/      client: /' "$WORK/$name.err" >&2
        sed 's/^/      server: /' "$WORK/$name.srv.err" >&2
        return 1
    fi
}

# jget FILE EXPR: evaluate a Python expression on the JSON document `d` in FILE.
jget() { "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }

SIZES=(65536 262144 1048576)
# Iterations per size: about a quarter to half a second each.
sv_bw_iters() { case "$1" in 65536) echo 4000 ;; 262144) echo 1200 ;; *) echo 400 ;; esac }
ucx_bw_iters() { case "$1" in 65536) echo 5000 ;; 262144) echo 2000 ;; *) echo 500 ;; esac }
pp_iters() { case "$1" in 65536) echo 2000 ;; 262144) echo 600 ;; *) echo 200 ;; esac }

# --- softverbs
sv_inproc_lat() {
    "$SV" perf send lat --in-process -s 8 -n 50000 --json > "$WORK/sv_ip_lat.json" || return 1
    record sv_inproc_lat_rtt_med "$(jget "$WORK/sv_ip_lat.json" '2*d["results"][0]["t_median_usec"]')" || return 1
    record sv_inproc_lat_rtt_p99 "$(jget "$WORK/sv_ip_lat.json" '2*d["results"][0]["t_p99_usec"]')" || return 1
}
sv_inproc_bw() { # SIZE
    "$SV" perf write bw --in-process -s "$1" -n "$(sv_bw_iters "$1")" --json > "$WORK/sv_ip_bw.json" || return 1
    record "sv_inproc_bw_$1" "$(jget "$WORK/sv_ip_bw.json" 'd["results"][0]["bw_gbit_per_sec"]')" || return 1
}
sv_xp_lat() {
    next_port
    pair sv_xp_lat "$PORT" -- "$SV" perf send lat --server --listen 127.0.0.1 -p "$PORT" \
        -- "$SV" perf send lat -s 8 -n 20000 --client 127.0.0.1 -p "$PORT" --json || return 1
    record sv_xp_lat_rtt_med "$(jget "$WORK/sv_xp_lat.out" '2*d["results"][0]["t_median_usec"]')" || return 1
    record sv_xp_lat_rtt_p99 "$(jget "$WORK/sv_xp_lat.out" '2*d["results"][0]["t_p99_usec"]')" || return 1
}
sv_xp_bw() { # SIZE
    next_port
    pair sv_xp_bw "$PORT" -- "$SV" perf write bw --server --listen 127.0.0.1 -p "$PORT" \
        -- "$SV" perf write bw -s "$1" -n "$(sv_bw_iters "$1")" --client 127.0.0.1 -p "$PORT" --json || return 1
    record "sv_xp_bw_$1" "$(jget "$WORK/sv_xp_bw.out" 'd["results"][0]["bw_gbit_per_sec"]')" || return 1
    printf 'sv_xp_bw_retrans_%s\t%s\n' "$1" "$(jget "$WORK/sv_xp_bw.out" 'd["client_counters"]["retransmitted_packets"]')" >> "$RESULTS"
}
sv_xp_ppbw() { # SIZE: send ping-pong of SIZE bytes, bandwidth = size / one-way (as fi_pingpong)
    next_port
    pair sv_xp_pp "$PORT" -- "$SV" perf send lat --server --listen 127.0.0.1 -p "$PORT" \
        -- "$SV" perf send lat -s "$1" -n "$(pp_iters "$1")" --client 127.0.0.1 -p "$PORT" --json || return 1
    record "sv_xp_ppbw_$1" "$(jget "$WORK/sv_xp_pp.out" "$1*8/d['results'][0]['t_avg_usec']/1e3")" || return 1
}

# --- bare baselines
udp_pp() {
    next_port
    pair udp_pp "$PORT" -- "$UB" pingpong-server --bind "127.0.0.1:$PORT" \
        -- "$UB" pingpong-client --connect "127.0.0.1:$PORT" -s 8 -n 50000 || return 1
    record udp_pp_rtt_med "$(jget "$WORK/udp_pp.out" 'd["rtt_median_usec"]')" || return 1
    record udp_pp_rtt_p99 "$(jget "$WORK/udp_pp.out" 'd["rtt_p99_usec"]')" || return 1
}
memcpy_bw() { # SIZE
    "$UB" memcpy -s "$1" --secs 0.3 > "$WORK/memcpy.json" || return 1
    record "memcpy_bw_$1" "$(jget "$WORK/memcpy.json" 'd["bw_gbit_per_sec"]')" || return 1
}
udp_stream() { # DATAGRAM_SIZE SECS -> prints Gbit/s
    next_port
    pair udp_stream "$PORT" -- "$UB" stream-server --bind "127.0.0.1:$PORT" \
        -- "$UB" stream-client --connect "127.0.0.1:$PORT" -s "$1" --secs "$2" || return 1
    jget "$WORK/udp_stream.srv" 'd["bw_gbit_per_sec"]'
}

# The best UDP throughput of this repetition: the best of a few datagram sizes (up to
# the largest IPv4 datagram; loopback's MTU is 64 KiB, so none is fragmented).
DGRAM_SIZES=(16384 32768 65507)
udp_stream_best() {
    local d bw best=0 best_d=0
    for d in "${DGRAM_SIZES[@]}"; do
        bw="$(udp_stream "$d" 0.5)" || return 1
        if "$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)' "$bw" "$best"; then
            best="$bw"
            best_d="$d"
        fi
    done
    log "    best UDP stream: $best Gbit/s with $best_d-byte datagrams"
    printf 'udp_stream_best_dgram\t%s\n' "$best_d" >> "$RESULTS"
    record udp_stream_best "$best" || return 1
}

# --- UCX and libfabric
ucx() { # NAME TLS TEST SIZE ITERS
    next_port
    pair "$1" "$PORT" -- env "UCX_TLS=$2" ucx_perftest -p "$PORT" \
        -- env "UCX_TLS=$2" ucx_perftest 127.0.0.1 -p "$PORT" -t "$3" -s "$4" -n "$5" -w "$(($5 / 10))" -f -v
}
# The last CSV line of ucx_perftest -v -f: iterations, typical (median) latency, average
# latency, overall latency (usec, one-way for *_lat tests), bandwidth average, overall
# (MiB/s), message rate average, overall.
ucx_field() { grep -E '^ *[0-9]' "$WORK/$1.out" | tail -1 | cut -d, -f"$2"; }
ucx_lat() { # KEY TLS
    ucx "ucx_lat" "$2" tag_lat 8 20000 || return 1
    record "$1" "$("$PY" -c 'import sys; print(2*float(sys.argv[1]))' "$(ucx_field ucx_lat 2)")" || return 1
}
ucx_bw() { # KEY TLS SIZE [TEST]
    ucx "ucx_bw" "$2" "${4:-ucp_put_bw}" "$3" "$(ucx_bw_iters "$3")" || return 1
    record "$1" "$("$PY" -c 'import sys; print(float(sys.argv[1])*1048576*8/1e9)' "$(ucx_field ucx_bw 6)")" || return 1
}
# fi_pingpong prints "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec" with
# usec/xfer the average one-way time and MB/sec = 10^6 bytes/s.
fi_pp() { # NAME PROVIDER EP SIZE ITERS
    next_port
    pair "$1" "$PORT" -- fi_pingpong -p "$2" -e "$3" -S "$4" -I "$5" -B "$PORT" \
        -- fi_pingpong -p "$2" -e "$3" -S "$4" -I "$5" -P "$PORT" 127.0.0.1
}
fi_lat() { # KEY PROVIDER EP
    fi_pp fi_lat "$2" "$3" 8 10000 || return 1
    record "$1" "$(awk 'NF==8 && $1 ~ /^[0-9]/ {v=$7} END {print 2*v}' "$WORK/fi_lat.out")" || return 1
}
fi_ppbw() { # KEY PROVIDER EP SIZE
    fi_pp fi_bw "$2" "$3" "$4" "$(pp_iters "$4")" || return 1
    record "$1" "$(awk 'NF==8 && $1 ~ /^[0-9]/ {v=$6} END {print v*8/1000}' "$WORK/fi_bw.out")" || return 1
}

# try DESCRIPTION CMD...: a failed measurement is reported and leaves its cell empty.
FAILED=0
try() {
    local what="$1"
    shift
    if ! "$@"; then
        log "    !! $what failed"
        FAILED=$((FAILED + 1))
    fi
}

# ---------------------------------------------------------------------------- run
log "==> $(date -u +%FT%TZ) on $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg); $REPS repetitions"

for rep in $(seq "$REPS"); do
    log "==> repetition $rep/$REPS (load $(cut -d' ' -f1 /proc/loadavg))"
    log "  1. in-process send latency"
    try "softverbs in-process send lat" sv_inproc_lat
    log "  2. cross-process send latency / bare UDP ping-pong"
    try "softverbs cross-process send lat" sv_xp_lat
    try "UDP ping-pong" udp_pp
    log "  3. write bandwidth / memcpy / UDP stream"
    for s in "${SIZES[@]}"; do
        try "softverbs in-process write bw $s" sv_inproc_bw "$s"
        try "memcpy $s" memcpy_bw "$s"
        try "softverbs cross-process write bw $s" sv_xp_bw "$s"
    done
    try "UDP stream" udp_stream_best
    log "  4. UCX (tcp, posix,cma) and libfabric (tcp, udp)"
    try "ucx tcp tag_lat" ucx_lat ucx_tcp_lat_rtt tcp
    try "ucx shm tag_lat" ucx_lat ucx_shm_lat_rtt posix,cma
    try "fi_pingpong tcp" fi_lat fi_tcp_lat_rtt tcp msg
    try "fi_pingpong udp" fi_lat fi_udp_lat_rtt udp dgram
    for s in "${SIZES[@]}"; do
        try "ucx tcp put_bw $s" ucx_bw "ucx_tcp_bw_$s" tcp "$s"
        try "ucx tcp tag_bw $s" ucx_bw "ucx_tcp_tagbw_$s" tcp "$s" tag_bw
        try "ucx shm put_bw $s" ucx_bw "ucx_shm_bw_$s" posix,cma "$s"
        try "softverbs cross-process send ping-pong $s" sv_xp_ppbw "$s"
        try "fi_pingpong tcp $s" fi_ppbw "fi_tcp_ppbw_$s" tcp msg "$s"
    done
done
log "==> done, load: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---------------------------------------------------------------------------- table
"$PY" - "$RESULTS" "$JSON" "$REPS" "$FAILED" << 'EOF'
import json, statistics, sys
from collections import defaultdict

path, as_json, reps, failed = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
samples = defaultdict(list)
for line in open(path):
    key, value = line.rstrip("\n").split("\t")
    try:
        samples[key].append(float(value))
    except ValueError:
        pass
med = {k: statistics.median(v) for k, v in samples.items() if v}
best_dgram = "/".join(str(int(d)) for d in samples.get("udp_stream_best_dgram", [])) or "?"

rows = []
def row(workload, sv_key, base_key, unit, lower_is_better, target=None, baseline_name=""):
    sv = med.get(sv_key) if sv_key else None
    base = med.get(base_key) if base_key else None
    ratio = sv / base if sv is not None and base not in (None, 0.0) else None
    verdict = "info"
    target_text = "-"
    if target is not None:
        kind, limit = target
        if kind == "abs<":
            target_text = f"< {limit:g} {unit}"
            verdict = "?" if sv is None else ("met" if sv < limit else "missed")
        elif kind == "ratio<=":
            target_text = f"<= {limit:g}x"
            verdict = "?" if ratio is None else ("met" if ratio <= limit else "missed")
        elif kind == "ratio>=":
            target_text = f">= {limit:g}x"
            verdict = "?" if ratio is None else ("met" if ratio >= limit else "missed")
    rows.append({
        "workload": workload, "unit": unit, "softverbs": sv, "baseline": base,
        "baseline_name": baseline_name, "ratio": ratio, "target": target_text,
        "verdict": verdict, "softverbs_samples": samples.get(sv_key, []),
        "baseline_samples": samples.get(base_key, []) if base_key else [],
    })

def size_name(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"

SIZES = [65536, 262144, 1048576]
row("1. in-process send 8 B RTT median", "sv_inproc_lat_rtt_med", None, "us", True, ("abs<", 2.0))
row("1. in-process send 8 B RTT p99", "sv_inproc_lat_rtt_p99", None, "us", True)
row("2. cross-process send 8 B RTT median", "sv_xp_lat_rtt_med", "udp_pp_rtt_med", "us", True, ("ratio<=", 1.3), "bare UDP ping-pong, busy-poll")
row("2. cross-process send 8 B RTT p99", "sv_xp_lat_rtt_p99", "udp_pp_rtt_p99", "us", True, None, "bare UDP ping-pong, busy-poll")
for s in SIZES:
    row(f"3. in-process write bw {size_name(s)}", f"sv_inproc_bw_{s}", f"memcpy_bw_{s}", "Gbit/s", False, ("ratio>=", 0.5), "memcpy")
for s in SIZES:
    row(f"3. cross-process write bw {size_name(s)}", f"sv_xp_bw_{s}", "udp_stream_best", "Gbit/s", False, ("ratio>=", 0.7), f"UDP stream, best datagram size (per run: {best_dgram} B)")
for key, name in [("ucx_tcp_lat_rtt", "UCX tcp tag_lat"), ("ucx_shm_lat_rtt", "UCX posix,cma tag_lat"),
                  ("fi_tcp_lat_rtt", "fi_pingpong tcp msg (avg)"), ("fi_udp_lat_rtt", "fi_pingpong udp dgram (avg)")]:
    row(f"4. 8 B RTT median vs {name}", "sv_xp_lat_rtt_med", key, "us", True, None, name)
for s in SIZES:
    row(f"4. write bw {size_name(s)} vs UCX tcp ucp_put_bw", f"sv_xp_bw_{s}", f"ucx_tcp_bw_{s}", "Gbit/s", False, None, "UCX tcp ucp_put_bw")
    row(f"4. write bw {size_name(s)} vs UCX tcp tag_bw", f"sv_xp_bw_{s}", f"ucx_tcp_tagbw_{s}", "Gbit/s", False, None, "UCX tcp tag_bw")
    row(f"4. write bw {size_name(s)} vs UCX posix,cma ucp_put_bw", f"sv_xp_bw_{s}", f"ucx_shm_bw_{s}", "Gbit/s", False, None, "UCX posix,cma ucp_put_bw")
    row(f"4. ping-pong bw {size_name(s)} vs fi_pingpong tcp", f"sv_xp_ppbw_{s}", f"fi_tcp_ppbw_{s}", "Gbit/s", False, None, "fi_pingpong tcp msg")

if as_json:
    print(json.dumps({"repetitions": reps, "statistic": "median", "best_udp_datagram": best_dgram,
                      "failed_measurements": failed, "rows": rows,
                      "retransmitted_packets_cross_process_bw": {str(s): samples.get(f"sv_xp_bw_retrans_{s}", []) for s in SIZES}},
                     indent=2))
    sys.exit(0)

def fmt(v):
    if v is None:
        return "n/a"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"

head = ("workload", "softverbs", "baseline", "ratio", "target", "result")
table = [head] + [(r["workload"], f'{fmt(r["softverbs"])} {r["unit"]}', f'{fmt(r["baseline"])} {r["unit"]}' if r["baseline_name"] else "-",
                   f'{r["ratio"]:.2f}x' if r["ratio"] is not None else "-", r["target"], r["verdict"]) for r in rows]
widths = [max(len(t[i]) for t in table) for i in range(len(head))]
print()
print(f"Medians of {reps} runs; latencies are round trips; ratio = softverbs / baseline.")
for i, t in enumerate(table):
    print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(t, widths))))
    if i == 0:
        print("  ".join("-" * w for w in widths))
print()
print("Baselines: 2 = udp-baseline pingpong (two processes, non-blocking, busy-polled); "
      f"3 = udp-baseline memcpy of the same size / udp-baseline stream (best of 16384/32768/65507-byte datagrams per run: {best_dgram}; goodput at the receiver);")
print("4 = ucx_perftest tag_lat / ucp_put_bw / tag_bw, fi_pingpong -e msg|dgram; ping-pong bw = size / one-way time "
      "(softverbs perf send lat -s SIZE against fi_pingpong -S SIZE).")
missed = [r["workload"] for r in rows if r["verdict"] == "missed"]
print(f"Targets met: {sum(r['verdict'] == 'met' for r in rows)}, missed: {len(missed)}" + (f" ({'; '.join(missed)})" if missed else ""))
if failed:
    print(f"WARNING: {failed} measurement(s) failed; see the messages above.")
EOF
