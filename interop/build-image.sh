#!/usr/bin/env bash
# The guest that runs the Linux kernel's Soft-RoCE (rdma_rxe) for the interop suite,
# built once and cached. Run as root. Prints the image directory as the last line of
# stdout; progress goes to stderr.
#
#   $CACHE/img-<key>/rootfs/      Debian bookworm (debootstrap minbase + rdma programs:
#                                 ibverbs-utils, perftest, rdmacm-utils),
#                                 shared read-only with the guest over virtio-9p; its
#                                 /lib/modules holds only the modules the guest loads
#   $CACHE/img-<key>/vmlinuz      Debian's 6.1 kernel (taken from the .deb, never installed
#                                 on the host)
#   $CACHE/img-<key>/initrd.img   busybox + virtio/9p/overlay modules + interop/guest/init
#   $CACHE/qemu.env               how to start QEMU (a system one, or one unpacked privately
#                                 when apt cannot install it next to this host's packages)
#
# <key> hashes this script, guest/init and the package lists: change any of them and the
# next run builds a new image. Old images are removed. env: SOFTVERBS_RXE_CACHE
# (default /var/tmp/softverbs-rxe), SOFTVERBS_RXE_MIRROR (default: the mirror apt uses).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${SOFTVERBS_RXE_CACHE:-/var/tmp/softverbs-rxe}
SUITE=bookworm
GUEST_PKGS=(iproute2 kmod ibverbs-utils ibverbs-providers perftest rdmacm-utils librdmacm1 busybox-static cpio)
BOOT_MODS=(virtio_pci virtio_net 9pnet_virtio 9p overlay)
# rdma_ucm is the kernel's RDMA CM for user space (/dev/infiniband/rdma_cm); it pulls
# rdma_cm, ib_cm and iw_cm, which rping, ucmatose and udaddy need over rxe.
RUN_MODS=(rdma_rxe ib_uverbs rdma_ucm crc32_generic crc32-pclmul)

T0=$SECONDS
log() { printf '[interop build +%ss] %s\n' "$((SECONDS - T0))" "$*" >&2; }
die() { printf '[interop build] FAILED: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (apt-get, debootstrap, chroot)"
export DEBIAN_FRONTEND=noninteractive
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock -w 900 9 || die "another build holds $CACHE/.lock"

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
apt_updated=0
apt_update() {
    [ $apt_updated = 1 ] && return 0
    log "apt-get update"
    timeout 300 apt-get update -qq >&2 || die "apt-get update failed"
    apt_updated=1
}
apt_install() { # apt_install PKG...: installs what is missing, never removes anything
    local need=() p
    for p in "$@"; do installed "$p" || need+=("$p"); done
    [ ${#need[@]} = 0 ] && return 0
    apt_update
    log "apt-get install ${need[*]}"
    timeout 900 apt-get install -y -qq --no-install-recommends --no-remove "${need[@]}" \
        > "$CACHE/apt.log" 2>&1 || { tail -5 "$CACHE/apt.log" >&2; return 1; }
}

# --- QEMU (host tool; independent of the image key) -----------------------------------
ensure_qemu() {
    if command -v qemu-system-x86_64 >/dev/null; then
        printf 'QEMU=%s\nQEMU_L=()\n' "$(command -v qemu-system-x86_64)" > "$CACHE/qemu.env"
        return 0
    fi
    if [ -f "$CACHE/qemu/complete" ]; then
        # The private copy's shared libraries and firmware come from packages: make sure
        # they are (still) installed.
        apt_install $(cat "$CACHE/qemu/deps")
        printf 'QEMU=%s\nQEMU_L=(-L %s -L /usr/share/seabios -L /usr/share/qemu -L /usr/lib/ipxe/qemu)\n' \
            "$CACHE/qemu/root/usr/bin/qemu-system-x86_64" "$CACHE/qemu/root/usr/share/qemu" > "$CACHE/qemu.env"
        return 0
    fi
    if apt_install qemu-system-x86 2>/dev/null && command -v qemu-system-x86_64 >/dev/null; then
        ensure_qemu; return 0
    fi
    # This host's qemu-utils may come from backports and Break bookworm's
    # qemu-system-common: install the dependencies, unpack the two qemu packages privately.
    log "qemu-system-x86 does not install beside this host's packages; unpacking it into $CACHE/qemu"
    apt_update
    local deps
    deps=$(apt-cache depends qemu-system-x86 qemu-system-common \
        | awk '/^ *(Pre)?Depends:/{print $2}' | tr -d '<>' | sort -u \
        | grep -vx -e qemu-system-common -e qemu-system-x86 -e 'qemu-system-x86:any')
    local real=($deps seabios ipxe-qemu qemu-system-data)
    apt_install "${real[@]}" || die "cannot install QEMU's dependencies"
    rm -rf "$CACHE/qemu"; mkdir -p "$CACHE/qemu/debs"
    (cd "$CACHE/qemu/debs" && timeout 600 apt-get download -qq qemu-system-x86 qemu-system-common 2>/dev/null) \
        || die "apt-get download qemu-system-x86 failed"
    local f; for f in "$CACHE"/qemu/debs/*.deb; do dpkg -x "$f" "$CACHE/qemu/root"; done
    rm -rf "$CACHE/qemu/debs"
    echo "${real[*]}" > "$CACHE/qemu/deps"
    "$CACHE/qemu/root/usr/bin/qemu-system-x86_64" --version | head -1 >&2 \
        || die "the unpacked QEMU does not run"
    touch "$CACHE/qemu/complete"
    ensure_qemu
}

# --- the image --------------------------------------------------------------------------
key=$({ cat "$0" "$HERE/guest/init"
        echo "$SUITE ${GUEST_PKGS[*]} / ${BOOT_MODS[*]} / ${RUN_MODS[*]}"; } | sha256sum | cut -c1-16)
IMG=$CACHE/img-$key

ensure_qemu
if [ -f "$IMG/complete" ]; then
    log "cached image $IMG (kernel $(cat "$IMG/kver"))"
    echo "$IMG"
    exit 0
fi

log "building $IMG"
rm -rf "$CACHE"/img-*.tmp
TMP=$IMG.tmp; mkdir -p "$TMP"
apt_install debootstrap
mirror=${SOFTVERBS_RXE_MIRROR:-$({ sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources
    sed -n 's/^deb[[:space:]]\+\([^[:space:]]*\).*/\1/p' /etc/apt/sources.list; } 2>/dev/null \
    | awk '$1 ~ /debian\/?$/ {print $1; exit}' || true)}
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian

# The kernel package that linux-image-amd64 points at, downloaded (not installed) while
# debootstrap runs.
apt_update
kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
[ -n "$kpkg" ] || die "cannot resolve linux-image-amd64"
mkdir -p "$TMP/kernel"
log "downloading $kpkg"
(cd "$TMP/kernel" && timeout 600 apt-get download -qq "$kpkg" 2>/dev/null) & kdl=$!

log "debootstrap $SUITE from $mirror: ${GUEST_PKGS[*]}"
timeout 1200 debootstrap --variant=minbase --include="$(IFS=,; echo "${GUEST_PKGS[*]}")" \
    "$SUITE" "$TMP/rootfs" "$mirror" > "$TMP/debootstrap.log" 2>&1 \
    || { tail -30 "$TMP/debootstrap.log" >&2; die "debootstrap failed (log: $TMP/debootstrap.log)"; }
chroot "$TMP/rootfs" apt-get clean
rm -rf "$TMP/rootfs"/usr/share/{doc,man,locale,info}
echo rxeguest > "$TMP/rootfs/etc/hostname"
wait $kdl || die "apt-get download $kpkg failed"

# Kernel and modules: the whole tree goes into the rootfs for depmod (run by the guest's
# own kmod in a chroot), then everything but the closure of the modules we load is removed.
dpkg -x "$TMP"/kernel/*.deb "$TMP/kernel/x"
KVER=$(basename "$(ls -d "$TMP"/kernel/x/lib/modules/*)")
cp "$TMP/kernel/x/boot/vmlinuz-$KVER" "$TMP/vmlinuz"
rm -rf "$TMP/rootfs/lib/modules"; mkdir -p "$TMP/rootfs/lib/modules"
mv "$TMP/kernel/x/lib/modules/$KVER" "$TMP/rootfs/lib/modules/$KVER"
rm -rf "$TMP/kernel"
chroot "$TMP/rootfs" depmod -a "$KVER"
closure() { for m in "$@"; do chroot "$TMP/rootfs" modprobe -S "$KVER" --show-depends "$m"; done \
            | awk '$1 == "insmod" {print $2}' | awk '!seen[$0]++'; }
closure "${BOOT_MODS[@]}" "${RUN_MODS[@]}" > "$TMP/keep"
MD=$TMP/rootfs/lib/modules/$KVER
find "$MD" -name '*.ko*' | sed "s#^$TMP/rootfs##" | sort > "$TMP/all"
sort "$TMP/keep" | comm -23 "$TMP/all" - | sed "s#^#$TMP/rootfs#" | xargs rm -f
find "$MD" -depth -type d -empty -delete
chroot "$TMP/rootfs" depmod -a "$KVER"
log "kernel $KVER; guest modules: $(find "$MD" -name '*.ko*' | wc -l) files"

# initramfs: static busybox from the rootfs, the boot modules in load order, our init.
IR=$TMP/rootfs/tmp/ir
mkdir -p "$IR"/{bin,dev,proc,sys,mnt,modules}
cp "$TMP/rootfs/bin/busybox" "$IR/bin/busybox"
install -m 755 "$HERE/guest/init" "$IR/init"
: > "$IR/modules.load"
for f in $(closure "${BOOT_MODS[@]}"); do
    case $f in *.ko) ;; *) die "compressed module $f: the busybox init loads plain .ko files";; esac
    cp "$TMP/rootfs$f" "$IR/modules/"; basename "$f" .ko >> "$IR/modules.load"
done
chroot "$TMP/rootfs" sh -c 'cd /tmp/ir && find . | cpio -o -H newc --quiet' | gzip -1 > "$TMP/initrd.img"
rm -rf "$IR"
echo "$KVER" > "$TMP/kver"
dpkg-query -W --admindir="$TMP/rootfs/var/lib/dpkg" -f='${Package} ${Version}\n' \
    linux-base ibverbs-utils ibverbs-providers perftest rdmacm-utils librdmacm1 iproute2 2>/dev/null > "$TMP/versions" || true
echo "$kpkg" >> "$TMP/versions"

touch "$TMP/complete"
for old in "$CACHE"/img-*; do
    if [ "$old" != "$TMP" ]; then rm -rf "$old"; fi
done
mv "$TMP" "$IMG"
log "image ready: $IMG ($(du -sh "$IMG" | cut -f1))"
echo "$IMG"
