#!/usr/bin/env bash
# The device benchmarks of issue 4, each beside its baseline measured in the same run:
#   1. in-process RC 8-byte send ping-pong round trip (median, p99)        target < 1 us
#   2. cross-process RC 8-byte send ping-pong over UDP loopback against a bare, busy-polled
#      UDP ping-pong of the same 8 bytes between two processes            target <= 1.3x
#   3. RDMA write bandwidth at 64 KiB, 256 KiB, 1 MiB: in-process against memcpy of the
#      same bytes (target >= 0.5x); cross-process against the best UDP throughput two
#      processes reach on loopback (target >= 0.7x)
#   4. the same workloads with ucx_perftest (UCX_TLS=tcp and posix,cma) and fi_pingpong
#      (providers tcp and udp), as the peers a user would pick instead; the ping-pong
#      bandwidth against fi_pingpong over TCP                              target >= 1x
#   5. two hosts: rows 2 and 3 with the same programs, the server and the client in two
#      network namespaces joined by a veth pair (MTU 1500), each against the same bare UDP
#      ping-pong (RTT target <= 1.3x; over IPv6 too) and stream (write bw target >= 0.5x)
#      across the same veth; the veth's GSO/GRO features (ethtool -k, before and after the
#      script turns GRO on) and the GSO sends and GRO segments the devices counted
#      (SOFTVERBS_STATS), so the table shows whether offload was used
#   6. the shared-memory path between two processes of one host (the device's default
#      network, SOFTVERBS_NETWORK unset): the programs of rows 2-3, against UCX
#      UCX_TLS=posix,cma and beside our UDP path of rows 2-3: 8-byte send round trip
#      (median target <= 2x UCX tag_lat; p99), RDMA write bandwidth at 64 KiB, 256 KiB,
#      1 MiB (64 KiB and 1 MiB target >= 0.5x UCX ucp_put_bw)
# Every row "over UDP" sets SOFTVERBS_NETWORK=udp, so it measures RoCEv2 over UDP whatever
# the device's default is; until the device has a shared-memory path, row 6 measures that
# same UDP path. The softverbs paths' send round trip at 64 KiB, 256 KiB and 1 MiB is
# measured too, for the picture (--json's "series", --plot).
#
# Usage: scripts/bench-device.sh [--json] [--reps N] [--plot FILE.svg]
#   --json    print the results as one JSON document on stdout (progress goes to stderr)
#   --reps N  repetitions of every measurement, medians reported (default 3)
#   --plot F  also draw the results into the SVG file F (softverbs plot): round trip and
#             bandwidth against the message size, softverbs' paths (in-process, shared
#             memory, UDP) beside UCX (posix,cma; tcp), fi_pingpong, memcpy and bare UDP
#
# Run by hand, as root (it installs ucx-utils, libfabric-bin and ethtool with apt-get if
# they are missing). Rows 1-4 and 6 talk over 127.0.0.0/8 only; row 5 over the veth pair between
# its two namespaces (10.211.0.0/24, fd00:211::/64), which only this run sees and which are
# removed at exit (without root, row 5 says it was not measured). The two sides of every
# two-process pair are pinned to different CPUs (CPU 0: server, CPU 1: client) when there are two;
# the in-process runs are left unpinned (the device may run a progress thread). All
# latencies in the table are round trips (perftest-like tools print half of that).
# Takes about 2.5-3 minutes on a 2-core machine, row 5 about 40 s of it (up to ~5 under
# heavy load). The machines are shared and noisy: compare the ratios of one run, not
# absolute numbers across runs.
set -euo pipefail
cd "$(dirname "$0")/.."

BENCH=bench-device
BENCH_PLOTS=1
# shellcheck source=scripts/lib/bench-common.sh
. scripts/lib/bench-common.sh
bench_parse_args "$@"

# ---------------------------------------------------------------------------- tools
bench_check_tools
need_pkg ucx_perftest ucx-utils
need_pkg fi_pingpong libfabric-bin
# Row 5 reports and turns on the veth's offloads with ethtool; without it, it still runs.
if [ "$(id -u)" = 0 ]; then (need_pkg ethtool ethtool) || log "    row 5 will not show the veth's offloads"; fi
bench_build "softverbs and udp-baseline" softverbs-cli

# ---------------------------------------------------------------------------- plumbing
bench_setup
# Each pair's network is the script's to choose (NET_ENV, on_shared_memory).
unset SOFTVERBS_NETWORK

# Keep every transport on loopback: UCX (ucx in bench-common.sh) and libfabric otherwise
# look at every interface.
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
sv_inproc_pp() { # SIZE: send ping-pong round trip of SIZE bytes (median), for the picture
    "$SV" perf send lat --in-process -s "$1" -n "$(pp_iters "$1")" --json > "$WORK/sv_ip_pp.json" || return 1
    record "sv_inproc_pp_rtt_$1" "$(jget "$WORK/sv_ip_pp.json" '2*d["results"][0]["t_median_usec"]')" || return 1
}
sv_inproc_bw() { # SIZE
    "$SV" perf write bw --in-process -s "$1" -n "$(sv_bw_iters "$1")" --json > "$WORK/sv_ip_bw.json" || return 1
    record "sv_inproc_bw_$1" "$(jget "$WORK/sv_ip_bw.json" 'd["results"][0]["bw_gbit_per_sec"]')" || return 1
}
# SIZE: send ping-pong of SIZE bytes between two processes, bandwidth = size / one-way (as
# fi_pingpong), and its round trip (median, for the picture); over UDP unless
# on_shared_memory.
sv_xp_ppbw() {
    next_port
    pair sv_xp_pp "$PORT" -- "${NET_ENV[@]}" "$SV" perf send lat --server --listen 127.0.0.1 -p "$PORT" \
        -- "${NET_ENV[@]}" "$SV" perf send lat -s "$1" -n "$(pp_iters "$1")" --client 127.0.0.1 -p "$PORT" --json || return 1
    record "${XP_KEY}sv_xp_ppbw_$1" "$(jget "$WORK/sv_xp_pp.out" "$1*8/d['results'][0]['t_avg_usec']/1e3")" || return 1
    record "${XP_KEY}sv_xp_pp_rtt_$1" "$(jget "$WORK/sv_xp_pp.out" "2*d['results'][0]['t_median_usec']")" || return 1
}

# --- bare baselines
memcpy_bw() { # SIZE
    "$UB" memcpy -s "$1" --secs 0.3 > "$WORK/memcpy.json" || return 1
    record "memcpy_bw_$1" "$(jget "$WORK/memcpy.json" 'd["bw_gbit_per_sec"]')" || return 1
}
# --- UCX and libfabric (ucx, ucx_field and ucx_lat in bench-common.sh)
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
fi_ppbw() { # KEY RTT_KEY PROVIDER EP SIZE: the bandwidth, and the round trip (for the picture)
    fi_pp fi_bw "$3" "$4" "$5" "$(pp_iters "$5")" || return 1
    record "$1" "$(awk 'NF==8 && $1 ~ /^[0-9]/ {v=$6} END {print v*8/1000}' "$WORK/fi_bw.out")" || return 1
    record "$2" "$(awk 'NF==8 && $1 ~ /^[0-9]/ {v=$7} END {print 2*v}' "$WORK/fi_bw.out")" || return 1
}

# ---------------------------------------------------------------------------- two hosts
# Row 5: two network namespaces joined by a veth pair, made once per run (names unique to
# the run) and removed at exit, a failed or interrupted run included. The server runs in
# A (10.211.0.1, fd00:211::1), the client in B (10.211.0.2, fd00:211::2): everything over
# IPv4, and the latency over IPv6 too. The MTU is the veth's default, 1500, as on
# plain Ethernet: the devices take their port MTU from the interface's, as rxe does (1024
# here, 4096 on loopback), so the same bytes take four times the packets of rows 2-3.
#
# What a veth does with UDP offload (Linux 6.x, checked on 6.18): it offers
# tx-udp-segmentation, so a UDP_SEGMENT (GSO) datagram crosses the pair whole and a
# receiving socket with UDP_GRO takes it as one coalesced datagram (softverbs counts its
# packets in gro_segments) -- no veth setting is needed for that. GRO proper (coalescing
# packets sent one by one) needs the receiving end's NAPI: `gro on` gives the veth NAPI,
# but packets a local socket sends use it only if the receiving end also has
# rx-udp-gro-forwarding (or rx-gro-list) on (veth_skb_is_eligible_for_gro in
# drivers/net/veth.c), so the script turns on both, on both ends. Even then what is sent
# one datagram at a time seldom coalesces (none of 200,000 1000-byte datagrams sent one
# per sendto did, in a check on 6.18): the veth's NAPI poll seems to run as each packet
# is sent, with that one packet to look at. So what the GRO counts show is GSO crossing.
VETH_NS_A="sv-bench-a-$$"
VETH_NS_B="sv-bench-b-$$"
VETH_DEV_A="svb$$a"
VETH_DEV_B="svb$$b"
VETH_ADDR_A=10.211.0.1
VETH_ADDR_B=10.211.0.2
VETH_ADDR6_A=fd00:211::1
VETH_ADDR6_B=fd00:211::2
VETH_SKIPPED="" # why the two-host rows could not be measured, if they could not
VETH_MADE=0
# The features the table reports, as `ethtool -k` names them, and those the script turns on.
VETH_FEATURES=(tx-udp-segmentation generic-receive-offload rx-udp-gro-forwarding rx-gro-list)
VETH_ENABLE=(gro on rx-udp-gro-forwarding on)

veth_remove() {
    [ "$VETH_MADE" = 1 ] || return 0
    # Deleting a namespace deletes its end of the pair, and with it the pair.
    ip netns del "$VETH_NS_A" 2> /dev/null || true
    ip netns del "$VETH_NS_B" 2> /dev/null || true
    VETH_MADE=0
}
veth_make() {
    if [ "$(id -u)" != 0 ]; then
        VETH_SKIPPED="not root (network namespaces need root)"
        return 1
    fi
    VETH_MADE=1
    CLEANUP_HOOKS+=(veth_remove)
    local err="$WORK/veth.err" ns dev a a6
    if ! { ip netns add "$VETH_NS_A" && ip netns add "$VETH_NS_B" &&
        ip link add "$VETH_DEV_A" netns "$VETH_NS_A" type veth peer name "$VETH_DEV_B" netns "$VETH_NS_B"; } 2> "$err"; then
        VETH_SKIPPED="cannot make the namespaces and the veth pair: $(head -1 "$err")"
        return 1
    fi
    for ns in A B; do
        if [ "$ns" = A ]; then
            set -- "$VETH_NS_A" "$VETH_DEV_A" "$VETH_ADDR_A" "$VETH_ADDR6_A"
        else
            set -- "$VETH_NS_B" "$VETH_DEV_B" "$VETH_ADDR_B" "$VETH_ADDR6_B"
        fi
        ns="$1" dev="$2" a="$3" a6="$4"
        if ! { ip -n "$ns" addr add "$a/24" dev "$dev" && ip -n "$ns" addr add "$a6/64" dev "$dev" nodad &&
            ip -n "$ns" link set "$dev" up && ip -n "$ns" link set lo up; } 2> "$err"; then
            VETH_SKIPPED="cannot address the veth pair: $(head -1 "$err")"
            return 1
        fi
    done
    log "==> two hosts: namespaces $VETH_NS_A ($VETH_ADDR_A) and $VETH_NS_B ($VETH_ADDR_B), veth $VETH_DEV_A-$VETH_DEV_B"
}
# A feature of a veth end as `ethtool -k` shows it ("on", "off [fixed]", ...).
veth_feature() { # NS DEV FEATURE
    ip netns exec "$1" ethtool -k "$2" 2> /dev/null | sed -n "s/^[[:space:]]*$3: //p"
}
# Turns on what GRO needs on both ends; writes the features before and after, one line
# per end and feature (END <TAB> FEATURE <TAB> BEFORE <TAB> AFTER), to $WORK/veth.features.
veth_offload() {
    local end ns dev f
    : > "$WORK/veth.features"
    for end in A B; do
        if [ "$end" = A ]; then ns="$VETH_NS_A" dev="$VETH_DEV_A"; else ns="$VETH_NS_B" dev="$VETH_DEV_B"; fi
        local -A before=()
        for f in "${VETH_FEATURES[@]}"; do before[$f]="$(veth_feature "$ns" "$dev" "$f")"; done
        if ! ip netns exec "$ns" ethtool -K "$dev" "${VETH_ENABLE[@]}" 2> "$WORK/veth.err"; then
            log "    ethtool -K $dev ${VETH_ENABLE[*]}: $(head -1 "$WORK/veth.err")"
        fi
        for f in "${VETH_FEATURES[@]}"; do
            printf '%s\t%s\t%s\t%s\n' "$end" "$f" "${before[$f]:-?}" "$(veth_feature "$ns" "$dev" "$f" | sed 's/^$/?/')" >> "$WORK/veth.features"
        done
    done
    log "    veth offload (end, feature, before, after):"
    sed 's/^/      /' "$WORK/veth.features" >&2
}

# on_veth FUNCTION ARGS...: one of the common measurements with the server in A and the
# client in B over IPv4, its samples under veth_* keys; under over_ipv6, over IPv6 with
# veth6_* keys. The devices write their SOFTVERBS_STATS lines to $WORK/veth.{srv,cli}.stats.
VETH_IP_A="$VETH_ADDR_A"
VETH_IP_B="$VETH_ADDR_B"
VETH_KEY=veth_
on_veth() {
    local XP_SERVER="$VETH_IP_A" XP_KEY="$VETH_KEY"
    local -a XP_HOST_S=(ip netns exec "$VETH_NS_A") XP_HOST_C=(ip netns exec "$VETH_NS_B") UB_ARGS=(--test-link)
    local -a DEV_ENV_S=(env "SOFTVERBS_ADDR=$VETH_IP_A" "SOFTVERBS_STATS=$WORK/veth.srv.stats")
    local -a DEV_ENV_C=(env "SOFTVERBS_ADDR=$VETH_IP_B" "SOFTVERBS_STATS=$WORK/veth.cli.stats")
    "$@"
}
over_ipv6() { # FUNCTION ARGS...
    local VETH_IP_A="$VETH_ADDR6_A" VETH_IP_B="$VETH_ADDR6_B" VETH_KEY=veth6_
    "$@"
}
# A counter of the transport part of the SOFTVERBS_STATS lines in FILE, summed over its
# devices; nothing if no device wrote one.
transport_counter() { # FILE NAME
    sed -n 's/.*; transport: \([^;]*\).*/\1/p' "$1" | tr ' ' '\n' |
        awk -F= -v k="$2" '$1 == k {s += $2; n++} END {if (n) print s}'
}
# veth_sv TAG FUNCTION ARGS...: a softverbs measurement across the veth, then what its
# devices counted of the offload (veth_{srv,cli}_COUNTER_TAG, veth6_... over IPv6).
veth_sv() {
    local tag="$1" side counter
    shift
    : > "$WORK/veth.srv.stats"
    : > "$WORK/veth.cli.stats"
    on_veth "$@" || return 1
    for side in srv cli; do
        for counter in sent_packets gso_sends received_packets gro_segments; do
            note "${VETH_KEY}${side}_${counter}_$tag" "$(transport_counter "$WORK/veth.$side.stats" "$counter")"
        done
    done
}

# ---------------------------------------------------------------------------- run
if veth_make; then veth_offload; else log "==> two hosts: not measured: $VETH_SKIPPED"; fi
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
        try "fi_pingpong tcp $s" fi_ppbw "fi_tcp_ppbw_$s" "fi_tcp_pp_rtt_$s" tcp msg "$s"
    done
    log "  6. shared memory between two processes (SOFTVERBS_NETWORK unset): send latency, write bandwidth"
    try "softverbs shared-memory send lat" on_shared_memory sv_xp_lat
    for s in "${SIZES[@]}"; do
        try "softverbs shared-memory write bw $s" on_shared_memory sv_xp_bw "$s" "$(sv_bw_iters "$s")"
    done
    log "     and, for the picture, the send round trip at ${SIZES[*]} bytes: in-process, shared memory"
    for s in "${SIZES[@]}"; do
        try "softverbs in-process send ping-pong $s" sv_inproc_pp "$s"
        try "softverbs shared-memory send ping-pong $s" on_shared_memory sv_xp_ppbw "$s"
    done
    log "  5. two hosts (namespaces + veth): send latency, write bandwidth / bare UDP"
    if [ -z "$VETH_SKIPPED" ]; then
        try "veth softverbs send lat" veth_sv lat sv_xp_lat
        try "veth UDP ping-pong" on_veth udp_pp 20000
        for s in "${SIZES[@]}"; do
            try "veth softverbs write bw $s" veth_sv "$s" sv_xp_bw "$s" "$(sv_bw_iters "$s")"
        done
        try "veth UDP stream" on_veth udp_stream_best
        try "veth IPv6 softverbs send lat" over_ipv6 veth_sv lat sv_xp_lat
        try "veth IPv6 UDP ping-pong" over_ipv6 on_veth udp_pp 20000
    else
        log "    not measured: $VETH_SKIPPED"
    fi
done
veth_remove
bench_done
VETH_KERNEL="$(uname -r)"
export VETH_SKIPPED VETH_FEATURES_FILE="$WORK/veth.features" VETH_KERNEL

# ---------------------------------------------------------------------------- table
# The table, or with --json the document (its "series" are what `softverbs plot` draws).
device_report() {
    bench_report << 'EOF'
SIZES = [65536, 262144, 1048576]
row("1. in-process send 8 B RTT median", "sv_inproc_lat_rtt_med", None, "us", True, ("abs<", 1.0))
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

import os
veth_skipped = os.environ.get("VETH_SKIPPED") or None
def dgrams(key):
    return "/".join(str(int(d)) for d in samples.get(key, [])) or "?"
veth_dgram = dgrams("veth_udp_stream_best_dgram")
veth_features = {}  # end -> feature -> (before, after)
try:
    for line in open(os.environ.get("VETH_FEATURES_FILE", "")):
        end, feature, before, after = line.rstrip("\n").split("\t")
        veth_features.setdefault(end, {})[feature] = (before, after)
except (OSError, ValueError):
    pass
def offload_row(workload, key, of_key):
    row(workload, key, of_key, "", False, None, "packets")
    v = med.get(key)
    rows[-1]["verdict"] = "n/a" if v is None else ("used" if v > 0 else "NOT USED")
row("5. two hosts (veth) send 8 B RTT median", "veth_sv_xp_lat_rtt_med", "veth_udp_pp_rtt_med", "us", True, ("ratio<=", 1.3), "bare UDP ping-pong across the veth, busy-poll")
row("5. two hosts (veth) send 8 B RTT p99", "veth_sv_xp_lat_rtt_p99", "veth_udp_pp_rtt_p99", "us", True, None, "bare UDP ping-pong across the veth, busy-poll")
for s in SIZES:
    row(f"5. two hosts (veth) write bw {size_name(s)}", f"veth_sv_xp_bw_{s}", "veth_udp_stream_best", "Gbit/s", False, ("ratio>=", 0.5), f"UDP stream across the veth, best datagram size (per run: {veth_dgram} B)")
for s in SIZES:
    offload_row(f"5. veth write {size_name(s)}: GSO sends / packets sent (client)", f"veth_cli_gso_sends_{s}", f"veth_cli_sent_packets_{s}")
    offload_row(f"5. veth write {size_name(s)}: GRO segments / packets received (server)", f"veth_srv_gro_segments_{s}", f"veth_srv_received_packets_{s}")
row("5. two hosts (veth, IPv6) send 8 B RTT median", "veth6_sv_xp_lat_rtt_med", "veth6_udp_pp_rtt_med", "us", True, ("ratio<=", 1.3), "bare UDP ping-pong across the veth, busy-poll")
row("5. two hosts (veth, IPv6) send 8 B RTT p99", "veth6_sv_xp_lat_rtt_p99", "veth6_udp_pp_rtt_p99", "us", True, None, "bare UDP ping-pong across the veth, busy-poll")
UCX_SHM_LAT = "UCX posix,cma tag_lat"
UCX_SHM_BW = "UCX posix,cma ucp_put_bw"
row("6. shared memory send 8 B RTT median vs UCX posix,cma", "shm_sv_xp_lat_rtt_med", "ucx_shm_lat_rtt", "us", True, ("ratio<=", 2.0), UCX_SHM_LAT)
row("6. shared memory send 8 B RTT median vs UDP path", "shm_sv_xp_lat_rtt_med", "sv_xp_lat_rtt_med", "us", True, None, "softverbs over UDP (row 2)")
row("6. shared memory send 8 B RTT p99 vs UDP path", "shm_sv_xp_lat_rtt_p99", "sv_xp_lat_rtt_p99", "us", True, None, "softverbs over UDP (row 2)")
for s in SIZES:
    target = ("ratio>=", 0.5) if s in (65536, 1048576) else None
    row(f"6. shared memory write bw {size_name(s)} vs UCX posix,cma", f"shm_sv_xp_bw_{s}", f"ucx_shm_bw_{s}", "Gbit/s", False, target, UCX_SHM_BW)
for s in SIZES:
    row(f"6. shared memory write bw {size_name(s)} vs UDP path", f"shm_sv_xp_bw_{s}", f"sv_xp_bw_{s}", "Gbit/s", False, None, "softverbs over UDP (row 3)")

# The picture's curves (softverbs plot): round trips in usec and bandwidths in Gbit/s
# against the message size, a point per measured median; a failed measurement leaves its
# point out, a curve with none stays (empty) so that the picture says it is missing.
def curve(name, softverbs, points):
    return {"name": name, "softverbs": softverbs,
            "points": [{"bytes": b, "value": med[k]} for b, k in points if k in med]}
series = {
    "latency_rtt_usec": [
        curve("softverbs in-process", True, [(8, "sv_inproc_lat_rtt_med")] + [(s, f"sv_inproc_pp_rtt_{s}") for s in SIZES]),
        curve("softverbs shared memory", True, [(8, "shm_sv_xp_lat_rtt_med")] + [(s, f"shm_sv_xp_pp_rtt_{s}") for s in SIZES]),
        curve("softverbs UDP", True, [(8, "sv_xp_lat_rtt_med")] + [(s, f"sv_xp_pp_rtt_{s}") for s in SIZES]),
        curve("UCX posix,cma", False, [(8, "ucx_shm_lat_rtt")]),
        curve("UCX tcp", False, [(8, "ucx_tcp_lat_rtt")]),
        curve("fi_pingpong tcp", False, [(8, "fi_tcp_lat_rtt")] + [(s, f"fi_tcp_pp_rtt_{s}") for s in SIZES]),
        curve("fi_pingpong udp", False, [(8, "fi_udp_lat_rtt")]),
        curve("bare UDP", False, [(8, "udp_pp_rtt_med")]),
    ],
    "bandwidth_gbit_per_sec": [
        curve("softverbs in-process", True, [(s, f"sv_inproc_bw_{s}") for s in SIZES]),
        curve("softverbs shared memory", True, [(s, f"shm_sv_xp_bw_{s}") for s in SIZES]),
        curve("softverbs UDP", True, [(s, f"sv_xp_bw_{s}") for s in SIZES]),
        curve("UCX posix,cma", False, [(s, f"ucx_shm_bw_{s}") for s in SIZES]),
        curve("UCX tcp", False, [(s, f"ucx_tcp_bw_{s}") for s in SIZES]),
        curve("memcpy", False, [(s, f"memcpy_bw_{s}") for s in SIZES]),
        # The best stream of the run, whatever its datagram size: the floor at every size.
        curve("bare UDP", False, [(s, "udp_stream_best") for s in SIZES]),
    ],
}

if as_json:
    counters = ("sent_packets", "gso_sends", "received_packets", "gro_segments")
    print(json.dumps({"repetitions": reps, "statistic": "median", "best_udp_datagram": best_dgram,
                      "failed_measurements": failed, "rows": rows,
                      "retransmitted_packets_cross_process_bw": {str(s): samples.get(f"sv_xp_bw_retrans_{s}", []) for s in SIZES},
                      "retransmitted_packets_shared_memory_bw": {str(s): samples.get(f"shm_sv_xp_bw_retrans_{s}", []) for s in SIZES},
                      "two_hosts": {
                          "not_measured": veth_skipped, "kernel": os.environ.get("VETH_KERNEL"), "veth_mtu": 1500,
                          "best_udp_datagram": veth_dgram,
                          "veth_features": {end: {f: {"before": b, "after": a} for f, (b, a) in fs.items()} for end, fs in veth_features.items()},
                          "retransmitted_packets_bw": {str(s): samples.get(f"veth_sv_xp_bw_retrans_{s}", []) for s in SIZES},
                          "device_counters": {tag: {f"{side}_{c}": samples.get(f"veth_{side}_{c}_{tag}", [])
                                                    for side in ("cli", "srv") for c in counters}
                                              for tag in ["lat"] + [str(s) for s in SIZES]},
                          "device_counters_ipv6": {tag: {f"{side}_{c}": samples.get(f"veth6_{side}_{c}_{tag}", [])
                                                         for side in ("cli", "srv") for c in counters}
                                                   for tag in ["lat"]},
                      },
                      "series": series},
                     indent=2))
    sys.exit(0)

print_table(f"Medians of {reps} runs; latencies are round trips; ratio = softverbs / baseline.")
print("Baselines: 2 = udp-baseline pingpong (two processes, non-blocking, busy-polled); "
      f"3 = udp-baseline memcpy of the same size / udp-baseline stream (best of 16384/32768/65507-byte datagrams per run: {best_dgram}; goodput at the receiver);")
print("4 = ucx_perftest tag_lat / ucp_put_bw / tag_bw, fi_pingpong -e msg|dgram; ping-pong bw = size / one-way time "
      "(softverbs perf send lat -s SIZE against fi_pingpong -S SIZE).")
print("5 = the programs of rows 2-3, server and client in two network namespaces joined by a veth pair (MTU 1500, so "
      f"RoCEv2 MTU 1024 and fragmented UDP datagrams; UDP stream per run: {veth_dgram} B); GSO/GRO counts from SOFTVERBS_STATS, medians per run.")
print("6 = the programs of rows 2-3 with SOFTVERBS_NETWORK unset (the device's default: shared memory between processes of one host, "
      "where the device has that path), against ucx_perftest UCX_TLS=posix,cma and rows 2-3 (SOFTVERBS_NETWORK=udp).")
if veth_skipped:
    print(f"5: NOT MEASURED: {veth_skipped}")
else:
    ends = list(veth_features.values())
    same = all(e == ends[0] for e in ends)
    def show(fs):
        return ", ".join(f"{f} {b}" + (f" -> {a}" if a != b else "") for f, (b, a) in fs.items())
    print(f"5: kernel {os.environ.get('VETH_KERNEL')}; veth offload (ethtool -k, before -> after ethtool -K gro on rx-udp-gro-forwarding on): "
          + ("; ".join(f"end {e}: {show(fs)}" for e, fs in veth_features.items()) if not same else (show(ends[0]) if ends else "unknown")))
print_summary()
EOF
}

# The picture first (from the same samples), so that a failure to draw is reported after
# the table, where it is seen.
PLOT_FAILED=0
if [ -n "$PLOT" ]; then
    if (JSON=1 device_report) > "$WORK/results.json" &&
        "$SV" plot --input "$WORK/results.json" --output "$PLOT" 2> "$WORK/plot.err"; then
        log "==> picture: $PLOT"
    else
        PLOT_FAILED=1
    fi
fi
device_report
if [ "$PLOT_FAILED" = 1 ]; then
    cat "$WORK/plot.err" >&2 2> /dev/null || true
    die "could not draw $PLOT"
fi
