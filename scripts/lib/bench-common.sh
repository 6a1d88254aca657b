# shellcheck shell=bash
# The plumbing shared by scripts/bench-device.sh and scripts/bench-dropin.sh; sourced by
# them (from the repository's root) after `set -euo pipefail`, never run on its own.
#
# A script sets BENCH (its name, for messages) and calls, in this order:
#   bench_parse_args "$@"      --json, --reps N, --help (prints the script's header comment);
#                              --plot FILE.svg too if the script set BENCH_PLOTS=1 (it sets
#                              PLOT, an absolute path, and is refused by the other scripts)
#   bench_check_tools          python3, taskset, ss
#   need_pkg COMMAND PACKAGE   for each program it runs that is not built here
#   bench_build WHAT PKG...    cargo build --release of the crates; sets SV, UB, TARGET_DIR
#   bench_setup                the work directory, the clean-up on exit, CPU pinning, ports
# then runs its measurements with `try`, which take their samples with `record`, and
# prints them with `bench_report` (Python on stdin, after the common part below).
#
# The measurements both scripts make (the softverbs CLI across two processes, the bare UDP
# ping-pong and stream of udp-baseline, UCX's tag_lat) are here too, so they are the same
# in both; the XP_* variables below move them from loopback to two hosts (network
# namespaces), and NET_ENV (on_shared_memory) from RoCEv2 over UDP to the device's
# default path between two processes of one host.

# Defaults the script's options override; read by the script and bench_report.
# shellcheck disable=SC2034 # JSON and REPS are read by the sourcing script
JSON=0
REPS=3
PLOT=""
FAILED=0
SERVER_PID=""
CLIENT_PID=""
WORK=""

log() { echo "$@" >&2; }
die() {
    echo "$BENCH: $*" >&2
    exit 1
}

# ---------------------------------------------------------------------------- options
bench_parse_args() {
    while [ $# -gt 0 ]; do
        case "$1" in
            --json) JSON=1 ;;
            --reps)
                REPS="${2:?--reps needs a number}"
                shift
                ;;
            --plot)
                if [ "${BENCH_PLOTS:-0}" != 1 ]; then
                    echo "$BENCH: unknown option $1 (see --help)" >&2
                    exit 2
                fi
                PLOT="${2:?--plot needs a file name (FILE.svg)}"
                shift
                # Relative to where the script was started: it has moved to the
                # repository's root since, and `cd` left the old directory in OLDPWD.
                case "$PLOT" in /*) ;; *) PLOT="${OLDPWD:-$PWD}/$PLOT" ;; esac
                # Refused now rather than after minutes of measuring.
                if [ ! -d "$(dirname "$PLOT")" ] || [ ! -w "$(dirname "$PLOT")" ]; then
                    echo "$BENCH: --plot $PLOT: the folder $(dirname "$PLOT") does not exist or is not writable" >&2
                    exit 2
                fi
                ;;
            -h | --help)
                # The script's header comment, between the #! line and `set -euo pipefail`
                # (the script has moved to the repository's root: $0 may be relative).
                sed -n '2,/^set -euo/p' "scripts/${0##*/}" | sed '$d' | sed 's/^# \{0,1\}//'
                exit 0
                ;;
            *)
                echo "$BENCH: unknown option $1 (see --help)" >&2
                exit 2
                ;;
        esac
        shift
    done
    case "$REPS" in '' | *[!0-9]* | 0) echo "$BENCH: --reps must be a positive number" >&2; exit 2 ;; esac
}

# ---------------------------------------------------------------------------- tools
PY=""
bench_check_tools() {
    PY="$(command -v python3 || true)"
    [ -n "$PY" ] || die "python3 is needed to parse the results"
    command -v taskset > /dev/null || die "taskset (util-linux) is needed"
    command -v ss > /dev/null || die "ss (iproute2) is needed"
}

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

# bench_build WHAT PACKAGE...: release build of the crates; sets TARGET_DIR, SV (the
# softverbs CLI) and UB (udp-baseline), which softverbs-cli builds.
TARGET_DIR=""
SV=""
UB=""
bench_build() {
    local what="$1" args=() p
    shift
    for p in "$@"; do args+=(-p "$p"); done
    log "==> building $what (release)"
    export CARGO_TERM_COLOR=never
    cargo build --release --locked "${args[@]}" >&2 || die "cargo build failed"
    TARGET_DIR="$(cargo metadata --format-version 1 --no-deps | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
    SV="$TARGET_DIR/release/softverbs"
    UB="$TARGET_DIR/release/udp-baseline"
    if [ ! -x "$SV" ] || [ ! -x "$UB" ]; then die "built binaries not found in $TARGET_DIR/release"; fi
}

# ---------------------------------------------------------------------------- plumbing
RESULTS=""
PIN_S=()
PIN_C=()
PORT=0
# Functions a script adds to run at exit, after the servers and clients are stopped and
# before the work directory goes (to remove what it made: network namespaces, ...).
CLEANUP_HOOKS=()
bench_cleanup() {
    # The timeout processes pass the signal on to the program they run.
    if [ -n "$CLIENT_PID" ]; then kill "$CLIENT_PID" 2> /dev/null || true; fi
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2> /dev/null || true; fi
    wait 2> /dev/null || true
    local hook
    for hook in "${CLEANUP_HOOKS[@]}"; do "$hook" || true; done
    if [ -n "$WORK" ]; then rm -rf "$WORK"; fi
}
bench_setup() {
    WORK="$(mktemp -d "/tmp/$BENCH.XXXXXX")"
    RESULTS="$WORK/results.tsv" # key <TAB> value, one line per sample
    : > "$RESULTS"
    trap bench_cleanup EXIT
    # An interrupted run still stops its server (a background server ignores ^C).
    trap 'exit 130' INT
    trap 'exit 143' TERM
    if [ "$(nproc)" -ge 2 ]; then
        PIN_S=(taskset -c 0)
        PIN_C=(taskset -c 1)
    else
        PIN_S=()
        PIN_C=()
    fi
    # Ports for the servers' TCP/UDP control or data sockets: one random base per run.
    PORT=$((20000 + RANDOM % 20000))
}
next_port() { PORT=$((PORT + 1)); }

# record KEY VALUE: one sample; a value that is not a number fails the measurement.
record() {
    if ! "$PY" -c 'import math,sys; v=float(sys.argv[1]); sys.exit(0 if math.isfinite(v) and v > 0 else 1)' "$2" 2> /dev/null; then
        log "    $1: not a measurement: '$2'"
        return 1
    fi
    printf '%s\t%s\n' "$1" "$2" >> "$RESULTS"
}
# note KEY VALUE: a side fact kept with the samples (any value, zero included).
note() { printf '%s\t%s\n' "$1" "$2" >> "$RESULTS"; }

# Where the two processes of a pair run: by default both on this host, the server on
# 127.0.0.1. A script that made two hosts (network namespaces) sets, for its measurements
# there (as `local`s of a function that calls them):
#   XP_SERVER             the server's address: it listens (and udp-baseline binds) there
#                         and the client connects to it
#   XP_HOST_S, XP_HOST_C  command prefixes that run the server / the client in its host
#                         (ip netns exec NS)
#   XP_KEY                a prefix of the samples' keys (veth_sv_xp_lat_rtt_med, ...)
#   UB_ARGS               udp-baseline's options (--test-link for a non-loopback address)
XP_SERVER=127.0.0.1
XP_HOST_S=()
XP_HOST_C=()
XP_KEY=""
UB_ARGS=()
# ADDRESS:PORT of the server for udp-baseline ([ADDRESS]:PORT for IPv6).
xp_udp_address() { case "$XP_SERVER" in *:*) echo "[$XP_SERVER]:$1" ;; *) echo "$XP_SERVER:$1" ;; esac }

# Waits until something listens on PORT (TCP or UDP) in the server's host, up to 10 s.
wait_port() {
    local i
    for i in $(seq 100); do
        if "${XP_HOST_S[@]}" ss -H -lntu "sport = :$1" 2> /dev/null | grep -q .; then return 0; fi
        sleep 0.1
    done
    return 1
}

# pair NAME PORT -- SERVER_CMD... -- CLIENT_CMD...: starts the server (CPU 0), waits for
# its port (or, when PAIR_READY names a function, for that function to succeed: a server
# that listens through the RDMA CM has no socket on PORT), runs the client (CPU 1) with its
# stdout in $WORK/NAME.out, the server's in $WORK/NAME.srv. Fails (returns 1) if either
# side fails or times out.
PAIR_READY=""
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
    if ! ${PAIR_READY:-wait_port} "$port"; then
        kill "$SERVER_PID" 2> /dev/null || true
        wait "$SERVER_PID" 2> /dev/null || true
        SERVER_PID=""
        log "    $name: the server never listened on port $port:"
        sed 's/^/      /' "$WORK/$name.srv.err" >&2
        return 1
    fi
    # The client runs in the background too, so that a signal to this script is handled
    # at once (bash runs traps only between commands, and `wait` is one).
    local rc=0
    timeout 90 "${PIN_C[@]}" "${cli[@]}" > "$WORK/$name.out" 2> "$WORK/$name.err" &
    CLIENT_PID=$!
    wait "$CLIENT_PID" || rc=$?
    CLIENT_PID=""
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

# try DESCRIPTION CMD...: a failed measurement is reported and leaves its cell empty.
try() {
    local what="$1"
    shift
    if ! "$@"; then
        log "    !! $what failed"
        FAILED=$((FAILED + 1))
    fi
}

bench_start() { log "==> $(date -u +%FT%TZ) on $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg); $REPS repetitions"; }
bench_rep() { log "==> repetition $1/$REPS (load $(cut -d' ' -f1 /proc/loadavg))"; }
bench_done() { log "==> done, load: $(cut -d' ' -f1-3 /proc/loadavg)"; }

# ---------------------------------------------------------------------------- measurements
# The network of the devices of a two-process pair, as a command prefix. By default
# `env SOFTVERBS_NETWORK=udp`: RoCEv2 over UDP, every packet through the kernel, which
# the rows "over UDP" measure -- set explicitly, so that they keep measuring the wire
# whatever the device's default is. `on_shared_memory FUNCTION ARGS...` runs a
# measurement with `env -u SOFTVERBS_NETWORK` instead: the device's default, which
# between two processes of one host is its shared-memory path (where the device has one;
# before that, the default is UDP and these rows measure what the UDP rows do), with
# "shm_" before its samples' keys. The scripts unset SOFTVERBS_NETWORK at start, so an
# inherited value changes neither.
NET_ENV=(env SOFTVERBS_NETWORK=udp)
on_shared_memory() {
    local -a NET_ENV=(env -u SOFTVERBS_NETWORK)
    local XP_KEY="shm_$XP_KEY"
    "$@"
}

# softverbs perf across two processes (the safe Rust API; over UDP loopback unless
# on_shared_memory). Its latency is perftest's one-way figure (round trip / 2): the keys
# hold the round trip. The devices take the first free 127.0.0.x unless the script puts
# a command prefix (such as env SOFTVERBS_ADDR=...) for the server's and the client's in
# DEV_ENV_S and DEV_ENV_C.
DEV_ENV_S=()
DEV_ENV_C=()
sv_xp_lat() {
    next_port
    pair sv_xp_lat "$PORT" -- "${XP_HOST_S[@]}" "${NET_ENV[@]}" "${DEV_ENV_S[@]}" "$SV" perf send lat --server --listen "$XP_SERVER" -p "$PORT" \
        -- "${XP_HOST_C[@]}" "${NET_ENV[@]}" "${DEV_ENV_C[@]}" "$SV" perf send lat -s 8 -n 20000 --client "$XP_SERVER" -p "$PORT" --json || return 1
    record "${XP_KEY}sv_xp_lat_rtt_med" "$(jget "$WORK/sv_xp_lat.out" '2*d["results"][0]["t_median_usec"]')" || return 1
    record "${XP_KEY}sv_xp_lat_rtt_p99" "$(jget "$WORK/sv_xp_lat.out" '2*d["results"][0]["t_p99_usec"]')" || return 1
}
sv_xp_bw() { # SIZE ITERS; tx-depth 128, the default of softverbs perf and of perftest
    next_port
    pair sv_xp_bw "$PORT" -- "${XP_HOST_S[@]}" "${NET_ENV[@]}" "${DEV_ENV_S[@]}" "$SV" perf write bw --server --listen "$XP_SERVER" -p "$PORT" \
        -- "${XP_HOST_C[@]}" "${NET_ENV[@]}" "${DEV_ENV_C[@]}" "$SV" perf write bw -s "$1" -n "$2" -t 128 --client "$XP_SERVER" -p "$PORT" --json || return 1
    record "${XP_KEY}sv_xp_bw_$1" "$(jget "$WORK/sv_xp_bw.out" 'd["results"][0]["bw_gbit_per_sec"]')" || return 1
    note "${XP_KEY}sv_xp_bw_retrans_$1" "$(jget "$WORK/sv_xp_bw.out" 'd["client_counters"]["retransmitted_packets"]')"
}

# The bare kernel UDP floor: udp-baseline between two processes.
udp_pp() { # [ITERS] (default 50000)
    next_port
    pair udp_pp "$PORT" -- "${XP_HOST_S[@]}" "$UB" "${UB_ARGS[@]}" pingpong-server --bind "$(xp_udp_address "$PORT")" \
        -- "${XP_HOST_C[@]}" "$UB" "${UB_ARGS[@]}" pingpong-client --connect "$(xp_udp_address "$PORT")" -s 8 -n "${1:-50000}" || return 1
    record "${XP_KEY}udp_pp_rtt_med" "$(jget "$WORK/udp_pp.out" 'd["rtt_median_usec"]')" || return 1
    record "${XP_KEY}udp_pp_rtt_p99" "$(jget "$WORK/udp_pp.out" 'd["rtt_p99_usec"]')" || return 1
}
# udp_stream DATAGRAM_SIZE SECS: sets UDP_STREAM_BW (Gbit/s). Not run in a $(...)
# subshell, so that the clean-up on exit knows its server and client.
UDP_STREAM_BW=""
udp_stream() {
    next_port
    pair udp_stream "$PORT" -- "${XP_HOST_S[@]}" "$UB" "${UB_ARGS[@]}" stream-server --bind "$(xp_udp_address "$PORT")" \
        -- "${XP_HOST_C[@]}" "$UB" "${UB_ARGS[@]}" stream-client --connect "$(xp_udp_address "$PORT")" -s "$1" --secs "$2" || return 1
    UDP_STREAM_BW="$(jget "$WORK/udp_stream.srv" 'd["bw_gbit_per_sec"]')" || return 1
}

# The best UDP throughput of this repetition: the best of a few datagram sizes (up to
# the largest IPv4 datagram; loopback's MTU is 64 KiB, so none is fragmented; a link of
# smaller MTU fragments them, as a bare UDP application's would be).
DGRAM_SIZES=(16384 32768 65507)
udp_stream_best() {
    local d bw best=0 best_d=0
    for d in "${DGRAM_SIZES[@]}"; do
        udp_stream "$d" 0.5 || return 1
        bw="$UDP_STREAM_BW"
        if "$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)' "$bw" "$best"; then
            best="$bw"
            best_d="$d"
        fi
    done
    log "    best UDP stream: $best Gbit/s with $best_d-byte datagrams"
    note "${XP_KEY}udp_stream_best_dgram" "$best_d"
    record "${XP_KEY}udp_stream_best" "$best" || return 1
}

# UCX's ucx_perftest between two processes on loopback (UCX_TLS=tcp, or posix,cma: shared
# memory and cross-memory attach, UCX's own path between processes of one host).
ucx() { # NAME TLS TEST SIZE ITERS
    next_port
    local -a ucx_env=(env "UCX_TLS=$2" UCX_NET_DEVICES=lo UCX_WARN_UNUSED_ENV_VARS=n)
    pair "$1" "$PORT" -- "${ucx_env[@]}" ucx_perftest -p "$PORT" \
        -- "${ucx_env[@]}" ucx_perftest 127.0.0.1 -p "$PORT" -t "$3" -s "$4" -n "$5" -w "$(($5 / 10))" -f -v
}
# The last CSV line of ucx_perftest -v -f: iterations, typical (median) latency, average
# latency, overall latency (usec, one-way for *_lat tests), bandwidth average, overall
# (MiB/s), message rate average, overall.
ucx_field() { grep -E '^ *[0-9]' "$WORK/$1.out" | tail -1 | cut -d, -f"$2"; }
ucx_lat() { # KEY TLS: tag_lat of 8 bytes, the median round trip
    ucx "ucx_lat" "$2" tag_lat 8 20000 || return 1
    record "$1" "$("$PY" -c 'import sys; print(2*float(sys.argv[1]))' "$(ucx_field ucx_lat 2)")" || return 1
}

# ---------------------------------------------------------------------------- report
# bench_report: runs the Python on stdin after this common part, with the samples' file,
# --json, --reps and the failure count. The common part gives it:
#   samples (key -> list of floats), med (key -> median), best_dgram;
#   row(workload, subject_key, baseline_key, unit, lower_is_better, target, baseline_name)
#     with target None, ("abs<", x), ("abs<=", x), ("ratio<=", x) or ("ratio>=", x),
#     appended to rows;
#   SUBJECT (the key of the measured figure in the JSON rows and, with "-" for "_", the
#   table's column; default "softverbs"), set before the first row();
#   size_name(bytes), fmt(value), print_table(title), print_summary().
bench_report_py() {
    cat << 'EOF'
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
SUBJECT = "softverbs"

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
            target_text = f"< {limit:.3g} {unit}"
            verdict = "?" if sv is None else ("met" if sv < limit else "missed")
        elif kind == "abs<=":
            target_text = f"<= {limit:.3g} {unit}"
            verdict = "?" if sv is None else ("met" if sv <= limit else "missed")
        elif kind == "ratio<=":
            target_text = f"<= {limit:.3g}x"
            verdict = "?" if ratio is None else ("met" if ratio <= limit else "missed")
        elif kind == "ratio>=":
            target_text = f">= {limit:.3g}x"
            verdict = "?" if ratio is None else ("met" if ratio >= limit else "missed")
    rows.append({
        "workload": workload, "unit": unit, SUBJECT: sv, "baseline": base,
        "baseline_name": baseline_name, "ratio": ratio, "target": target_text,
        "verdict": verdict, f"{SUBJECT}_samples": samples.get(sv_key, []),
        "baseline_samples": samples.get(base_key, []) if base_key else [],
    })

def size_name(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"

def fmt(v):
    if v is None:
        return "n/a"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"

def print_table(title):
    head = ("workload", SUBJECT.replace("_", "-"), "baseline", "ratio", "target", "result")
    table = [head] + [(r["workload"], f"{fmt(r[SUBJECT])} {r['unit']}".rstrip(), f"{fmt(r['baseline'])} {r['unit']}".rstrip() if r["baseline_name"] else "-",
                       f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-", r["target"], r["verdict"]) for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(len(head))]
    print()
    print(title)
    for i, t in enumerate(table):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(t, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print()

def print_summary():
    missed = [r["workload"] for r in rows if r["verdict"] == "missed"]
    print(f"Targets met: {sum(r['verdict'] == 'met' for r in rows)}, missed: {len(missed)}" + (f" ({'; '.join(missed)})" if missed else ""))
    if failed:
        print(f"WARNING: {failed} measurement(s) failed; see the messages above.")
EOF
}
bench_report() {
    { bench_report_py; cat; } | "$PY" - "$RESULTS" "$JSON" "$REPS" "$FAILED"
}
