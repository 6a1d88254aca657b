#!/bin/sh
# Stage 2 of the interop guest (started by interop/guest/init from the 9p share).
#
# Brings up eth0 (the NIC wired to the host's tap) with an IPv4 and an IPv6 address and
# rxe0 on it, writes out/ready (the GID indices of both addresses), then
# runs the jobs the host driver (interop/host/driver.py) drops into jobs/, in order:
#   jobs/N      shell assignments, read with ".": NAME, CMD (run by sh -c), TO (seconds,
#               the job is killed after it), LISTEN (a TCP port: out/N.ready appears once
#               something listens there, or once the job has ended), CMLISTEN (an RDMA CM
#               port: out/N.ready appears once `rdma resource show cm_id` lists a
#               listening id on that port, or once the job has ended); with neither,
#               out/N.ready appears once the job started
#   out/N.log   the job's stdout and stderr; out/N.pid: its timeout(1) process;
#   out/N.rc    its exit status (124: killed by its timeout), written last
#   jobs/stop   ends the agent (the guest powers off)
# Every wait is bounded: the agent stops by itself after sv_limit seconds of uptime.
SHARE=/mnt/share; JOBS=$SHARE/jobs; OUT=$SHARE/out
IP=${sv_ip:-10.99.0.2}; IP6=${sv_ip6:-fd99::2}; MTU=${sv_mtu:-9000}; LIMIT=${sv_limit:-1800}
mkdir -p "$OUT"
up() { cut -d' ' -f1 /proc/uptime; }
log() { echo "[guest $(up)s] $*"; }
past() { awk -v n="$(up)" -v l="$1" 'BEGIN { exit !(n > l) }'; }
wait_for() { # wait_for SECONDS CMD...: polls CMD every 50 ms, at most SECONDS
    lim=$(awk -v n="$(up)" -v s="$1" 'BEGIN { print n + s }'); shift
    until "$@"; do past "$lim" && return 1; sleep 0.05; done
}
listening() { # listening PORT: some TCP socket (v4 or v6) listens on PORT
    grep -qi "^ *[0-9]*: [0-9A-F]*:$(printf %04X "$1") [0-9A-F]*:0000 0A " /proc/net/tcp /proc/net/tcp6
}
ready_or_gone() { listening "$1" || ! kill -0 "$2" 2>/dev/null; }
cm_listening() { # cm_listening PORT: the kernel's RDMA CM has a listening id on PORT
    # (an RDMA CM listener has no TCP socket; iproute2 lists it: "... state LISTEN ps TCP
    # ... src-addr 10.99.0.2:7471 ...", an IPv6 one as "src-addr fd99::2:7471")
    rdma resource show cm_id 2>/dev/null | grep -q "state LISTEN .*src-addr [^ ]*:$1 "
}
cm_ready_or_gone() { cm_listening "$1" || ! kill -0 "$2" 2>/dev/null; }
publish() { # publish FILE: write stdin to FILE atomically (the host polls for it)
    cat > "$1.tmp" && mv "$1.tmp" "$1"
}
fail() { log "setup failed: $*"; echo "$*" | publish "$OUT/setup-failed"; exit 1; }

log "stage 2, kernel $(uname -r), ip $IP, mtu $MTU"
mount -t tmpfs tmpfs /tmp; mount -t tmpfs tmpfs /run
ip link set lo up
ip link set eth0 mtu "$MTU" || fail "ip link set eth0 mtu $MTU"
ip link set eth0 up
ip addr add "$IP/24" dev eth0 || fail "ip addr add $IP/24"
ip -6 addr add "$IP6/64" dev eth0 nodad || fail "ip -6 addr add $IP6/64"
modprobe rdma_rxe || fail "modprobe rdma_rxe"
log "rdma_rxe loaded"
modprobe rdma_ucm || fail "modprobe rdma_ucm"
[ -c /dev/infiniband/rdma_cm ] || fail "rdma_ucm loaded but /dev/infiniband/rdma_cm is missing"
log "rdma_ucm loaded (the kernel's RDMA CM: rdma_cm, ib_cm, iw_cm)"
rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0"
log "rxe0 added"
# The GIDs rxe made for our two addresses, as sysfs spells them (eight 4-digit groups).
gid4=$(echo "$IP" | awk -F. '{ printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1, $2, $3, $4 }')
gid6=$sv_gid6   # the host spells it out (fd99:0000:...:0002)
[ -n "$gid6" ] || fail "no sv_gid6= on the kernel command line"
GIDS=/sys/class/infiniband/rxe0/ports/1/gids
gid_index() { grep -lx "$1" $GIDS/* 2>/dev/null | head -1 | sed 's#.*/##'; }
has_gids() { [ -n "$(gid_index "$gid4")" ] && [ -n "$(gid_index "$gid6")" ]; }
wait_for 20 has_gids || fail "rxe0 has no GID $gid4 or $gid6 after 20 s"
GIDX4=$(gid_index "$gid4"); GIDX6=$(gid_index "$gid6")
ibv_devinfo -v -d rxe0 > "$OUT/ibv_devinfo.txt" 2>&1
rdma link show > "$OUT/rdma_link.txt" 2>&1
log "rxe0 up: GID $GIDX4 = ::ffff:$IP, GID $GIDX6 = $IP6, $(grep -m1 active_mtu "$OUT/ibv_devinfo.txt" | tr -s ' \t' ' ')"
printf 'GIDX4=%s\nGIDX6=%s\nKERNEL=%s\n' "$GIDX4" "$GIDX6" "$(uname -r)" | publish "$OUT/ready"

run_job() { # run_job N: starts job N in the background
    n=$1
    (
        NAME=job$n; CMD=true; TO=60; LISTEN=; CMLISTEN=
        . "$JOBS/$n"
        timeout -k 2 "$TO" sh -c "$CMD" > "$OUT/$n.log" 2>&1 &
        pid=$!
        echo $pid | publish "$OUT/$n.pid"
        if [ -n "$LISTEN" ]; then
            wait_for 30 ready_or_gone "$LISTEN" "$pid"
            : | publish "$OUT/$n.ready"
        elif [ -n "$CMLISTEN" ]; then
            wait_for 30 cm_ready_or_gone "$CMLISTEN" "$pid"
            : | publish "$OUT/$n.ready"
        else
            # nothing to wait for (a multicast receiver): ready once started
            : | publish "$OUT/$n.ready"
        fi
        wait $pid
        echo $? | publish "$OUT/$n.rc"
    ) &
}

n=1
while :; do
    if [ -e "$JOBS/$n" ]; then
        run_job $n
        n=$((n + 1))
        continue
    fi
    [ -e "$JOBS/stop" ] && break
    if past "$LIMIT"; then log "time limit of $LIMIT s reached"; break; fi
    sleep 0.05
done
log "agent done after $((n - 1)) jobs"
