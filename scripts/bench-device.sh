#!/usr/bin/env bash
# The device benchmarks of issue 4, each beside its baseline measured in the same run:
#   1. in-process RC 8-byte send ping-pong round trip (median, p99)        target < 2 us
#   2. cross-process RC 8-byte send ping-pong over UDP loopback against a bare, busy-polled
#      UDP ping-pong of the same 8 bytes between two processes            target <= 1.3x
#   3. RDMA write bandwidth at 64 KiB, 256 KiB, 1 MiB: in-process against memcpy of the
#      same bytes (target >= 0.5x); cross-process against the best UDP throughput two
#      processes reach on loopback (target >= 0.7x)
#   4. the same workloads with ucx_perftest (UCX_TLS=tcp and posix,cma) and fi_pingpong
#      (providers tcp and udp), as the peers a user would pick instead; the ping-pong
#      bandwidth against fi_pingpong over TCP                              target >= 1x
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

BENCH=bench-device
# shellcheck source=scripts/lib/bench-common.sh
. scripts/lib/bench-common.sh
bench_parse_args "$@"

# ---------------------------------------------------------------------------- tools
bench_check_tools
need_pkg ucx_perftest ucx-utils
need_pkg fi_pingpong libfabric-bin
bench_build "softverbs and udp-baseline" softverbs-cli

# ---------------------------------------------------------------------------- plumbing
bench_setup

# Keep every transport on loopback: UCX and libfabric otherwise look at every interface.
export UCX_NET_DEVICES=lo UCX_WARN_UNUSED_ENV_VARS=n
export FI_TCP_IFACE=lo FI_UDP_IFACE=lo FI_SOCKETS_IFACE=lo

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
sv_xp_ppbw() { # SIZE: send ping-pong of SIZE bytes, bandwidth = size / one-way (as fi_pingpong)
    next_port
    pair sv_xp_pp "$PORT" -- "$SV" perf send lat --server --listen 127.0.0.1 -p "$PORT" \
        -- "$SV" perf send lat -s "$1" -n "$(pp_iters "$1")" --client 127.0.0.1 -p "$PORT" --json || return 1
    record "sv_xp_ppbw_$1" "$(jget "$WORK/sv_xp_pp.out" "$1*8/d['results'][0]['t_avg_usec']/1e3")" || return 1
}

# --- bare baselines
memcpy_bw() { # SIZE
    "$UB" memcpy -s "$1" --secs 0.3 > "$WORK/memcpy.json" || return 1
    record "memcpy_bw_$1" "$(jget "$WORK/memcpy.json" 'd["bw_gbit_per_sec"]')" || return 1
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

# ---------------------------------------------------------------------------- run
bench_start

for rep in $(seq "$REPS"); do
    bench_rep "$rep"
    log "  1. in-process send latency"
    try "softverbs in-process send lat" sv_inproc_lat
    log "  2. cross-process send latency / bare UDP ping-pong"
    try "softverbs cross-process send lat" sv_xp_lat
    try "UDP ping-pong" udp_pp
    log "  3. write bandwidth / memcpy / UDP stream"
    for s in "${SIZES[@]}"; do
        try "softverbs in-process write bw $s" sv_inproc_bw "$s"
        try "memcpy $s" memcpy_bw "$s"
        try "softverbs cross-process write bw $s" sv_xp_bw "$s" "$(sv_bw_iters "$s")"
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
bench_done

# ---------------------------------------------------------------------------- table
bench_report << 'EOF'
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
    row(f"4. ping-pong bw {size_name(s)} vs fi_pingpong tcp", f"sv_xp_ppbw_{s}", f"fi_tcp_ppbw_{s}", "Gbit/s", False, ("ratio>=", 1.0), "fi_pingpong tcp msg")

if as_json:
    print(json.dumps({"repetitions": reps, "statistic": "median", "best_udp_datagram": best_dgram,
                      "failed_measurements": failed, "rows": rows,
                      "retransmitted_packets_cross_process_bw": {str(s): samples.get(f"sv_xp_bw_retrans_{s}", []) for s in SIZES}},
                     indent=2))
    sys.exit(0)

print_table(f"Medians of {reps} runs; latencies are round trips; ratio = softverbs / baseline.")
print("Baselines: 2 = udp-baseline pingpong (two processes, non-blocking, busy-polled); "
      f"3 = udp-baseline memcpy of the same size / udp-baseline stream (best of 16384/32768/65507-byte datagrams per run: {best_dgram}; goodput at the receiver);")
print("4 = ucx_perftest tag_lat / ucp_put_bw / tag_bw, fi_pingpong -e msg|dgram; ping-pong bw = size / one-way time "
      "(softverbs perf send lat -s SIZE against fi_pingpong -S SIZE).")
print_summary()
EOF
