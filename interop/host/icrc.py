#!/usr/bin/env python3
"""Checks the ICRC of every RoCEv2 packet in a pcap file; prints JSON, per sender.

A second, independent check beside `softverbs pcap` (Python standard library only). The
ICRC (IBTA Annex A17, RoCEv2) is the CRC-32 of: 8 bytes of 0xff standing for the masked
LRH; the IP header with its variant fields set to all ones (IPv4: TOS, TTL, header
checksum; IPv6: traffic class, flow label, hop limit); the UDP header with its checksum
set to all ones; the BTH with byte 4 (FECN, BECN, reserved) set to all ones; and the rest
of the IB packet. The CRC is carried least significant byte first.

With --pingpong-windows FILE (JSON: a list of [start, end, message size, path MTU], UNIX
times, one per ibv_*_pingpong run), the payload of every SEND packet inside a window is also checked
against what those programs send: with -c every byte is 0x7b except the first byte of
each 4096-byte page of the message, which is 0. Each side receives into the buffer it
then sends from, so a byte misplaced by either receiver shows up in its next SEND.

Usage: icrc.py [--pingpong-windows FILE] FILE.pcap
       (link type Ethernet, raw IP, IPv4 or IPv6; pcap, not pcapng)
Exit status: 0 if every packet sent to UDP port 4791 verified, 1 otherwise.
"""
import ipaddress
import json
import struct
import sys
import zlib

ROCE_PORT = 4791
ETH, RAW, RAW_IPV4, RAW_IPV6, LINUX_SLL = 1, 101, 228, 229, 113


def icrc_of(ip: bytes, udp: bytes, ib: bytes) -> int:
    ip = bytearray(ip)
    if ip[0] >> 4 == 4:
        ip[1] = 0xff                 # TOS (DSCP, ECN)
        ip[8] = 0xff                 # TTL
        ip[10:12] = b"\xff\xff"      # header checksum
    else:
        ip[0] |= 0x0f                # traffic class, high nibble
        ip[1:4] = b"\xff\xff\xff"    # traffic class, low nibble; flow label
        ip[7] = 0xff                 # hop limit
    udp = bytearray(udp)
    udp[6:8] = b"\xff\xff"
    bth = bytearray(ib[:12])
    bth[4] = 0xff
    return zlib.crc32(ib[12:], zlib.crc32(bytes(bth), zlib.crc32(bytes(udp), zlib.crc32(
        bytes(ip), zlib.crc32(b"\xff" * 8)))))


def packets(path):
    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) < 24:
            return
        magic = head[:4]
        if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
            end = "<"
        elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
            end = ">"
        else:
            raise SystemExit(f"{path}: not a pcap file (pcapng is not read here)")
        linktype = struct.unpack(end + "I", head[20:24])[0] & 0xffff
        frac_div = 1e9 if magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d") else 1e6
        rec = struct.Struct(end + "IIII")
        while True:
            h = f.read(16)
            if len(h) < 16:
                return
            ts_sec, ts_frac, caplen, origlen = rec.unpack(h)
            data = f.read(caplen)
            if len(data) < caplen:
                return
            yield linktype, data, caplen < origlen, ts_sec + ts_frac / frac_div


def ip_of(linktype, frame):
    if linktype == ETH:
        at, etype = 12, struct.unpack("!H", frame[12:14])[0]
        while etype in (0x8100, 0x88a8):
            at += 4
            etype = struct.unpack("!H", frame[at:at + 2])[0]
        return frame[at + 2:] if etype in (0x0800, 0x86dd) else None
    if linktype == LINUX_SLL:
        return frame[16:]
    if linktype in (RAW, RAW_IPV4, RAW_IPV6):
        return frame
    return None


PAGE = 4096
# SEND opcodes: RC and UC FIRST, MIDDLE, LAST, LAST_IMM, ONLY, ONLY_IMM; UD ONLY, ONLY_IMM
SEND_FIRST, SEND_MIDDLE = {0x00, 0x20}, {0x01, 0x21}
SEND_ONLY = {0x04, 0x05, 0x24, 0x25, 0x64, 0x65}
SEND_ANY = SEND_FIRST | SEND_MIDDLE | {0x02, 0x03, 0x22, 0x23} | SEND_ONLY


class PayloadCheck:
    """The pingpong pattern. A window is [start, end, message size, path MTU]: every
    message of a run has the same size, so the packets of a flow (window, source,
    destination, destination QP) fall into messages of n = ceil(size / MTU) packets, and
    one FIRST (or LAST / ONLY) packet seen anchors the offset of every other packet, even
    when packets were dropped before the capture point."""

    def __init__(self, windows):
        self.windows = sorted(tuple(w) for w in windows)
        self.anchor = {}   # flow -> PSN of some message's first packet
        self.by_sender = {}

    def window(self, t):
        for i, w in enumerate(self.windows):
            if w[0] <= t <= w[1]:
                return i, w
        return None, None

    def check(self, t, src, dst, ib):
        op = ib[0]
        if op not in SEND_ANY:
            return
        i, w = self.window(t)
        if w is None:
            return
        size, mtu = w[2], w[3]
        npk = max(1, -(-size // mtu))
        pad = (ib[1] >> 4) & 3
        dqpn = int.from_bytes(ib[5:8], "big")
        psn = int.from_bytes(ib[9:12], "big")
        hdr = 12 + (8 if op >= 0x60 else 0) + (4 if op in (0x03, 0x05, 0x23, 0x25, 0x65) else 0)
        payload = ib[hdr:len(ib) - 4 - pad]
        flow = (i, src, dst, dqpn)
        if op in SEND_ONLY:
            offset = 0
            self.anchor[flow] = (psn + 1) & 0xffffff
        elif op in SEND_FIRST:
            offset = 0
            self.anchor[flow] = psn
        else:
            if flow not in self.anchor:
                return        # no FIRST / LAST of this run seen yet
            dist = (psn - self.anchor[flow]) & 0xffffff
            if dist >= 0x800000:
                dist -= 0x1000000       # PSNs are 24-bit: a packet before the anchor
            offset = (dist % npk) * mtu
            if op not in SEND_MIDDLE:
                self.anchor[flow] = (psn + 1) & 0xffffff
        d = self.by_sender.setdefault(src, {"checked": 0, "bad": 0})
        d["checked"] += 1
        want = bytes(0 if (offset + j) % PAGE == 0 else 0x7b for j in range(len(payload)))
        if payload != want:
            d["bad"] += 1
            if len(d.setdefault("bad_examples", [])) < 3:
                at = next((j for j in range(min(len(payload), len(want))) if payload[j] != want[j]), 0)
                d["bad_examples"].append({"time": t, "opcode": f"0x{op:02x}", "psn": psn,
                                          "message_offset": offset + at, "len": len(payload),
                                          "byte": payload[at] if payload else None,
                                          "expected": want[at] if want else None})


def main():
    args = sys.argv[1:]
    pp = None
    if args[:1] == ["--pingpong-windows"]:
        with open(args[1]) as f:
            pp = PayloadCheck(json.load(f))
        args = args[2:]
    path = args[0]
    senders = {}
    total = {"packets": 0, "icrc_ok": 0, "icrc_bad": 0, "truncated": 0}
    for linktype, frame, truncated, t in packets(path):
        pkt = ip_of(linktype, frame)
        if not pkt:
            continue
        if pkt[0] >> 4 == 4:
            ihl = (pkt[0] & 0x0f) * 4
            if pkt[9] != 17:
                continue
            pkt = pkt[:struct.unpack("!H", pkt[2:4])[0]]   # no Ethernet padding
            src = ".".join(str(b) for b in pkt[12:16])
        elif pkt[0] >> 4 == 6:
            ihl = 40
            if pkt[6] != 17:
                continue
            pkt = pkt[:40 + struct.unpack("!H", pkt[4:6])[0]]
            src = str(ipaddress.IPv6Address(bytes(pkt[8:24])))
        else:
            continue
        udp, ib = pkt[ihl:ihl + 8], pkt[ihl + 8:]
        if len(udp) < 8 or struct.unpack("!H", udp[2:4])[0] != ROCE_PORT:
            continue
        d = senders.setdefault(src, {"packets": 0, "icrc_ok": 0, "icrc_bad": 0, "opcodes": {}})
        d["packets"] += 1
        total["packets"] += 1
        if truncated:
            total["truncated"] += 1
        if len(ib) < 16:
            ok = False
        else:
            ok = icrc_of(pkt[:ihl], udp, ib[:-4]) == struct.unpack("<I", ib[-4:])[0]
        key = "icrc_ok" if ok else "icrc_bad"
        d[key] += 1
        total[key] += 1
        if ok and pp:
            pp.check(t, src, ".".join(str(b) for b in pkt[16:20]) if ihl != 40 else
                     str(ipaddress.IPv6Address(bytes(pkt[24:40]))), ib)
        op = f"0x{ib[0]:02x}" if ib else "none"
        d["opcodes"][op] = d["opcodes"].get(op, 0) + 1
        if not ok and len(d.setdefault("bad_examples", [])) < 3:
            d["bad_examples"].append({"packet_no": total["packets"], "opcode": op, "len": len(ib)})
    out = {"file": path, "total": total, "by_sender": senders}
    bad_payload = 0
    if pp:
        out["pingpong_payload"] = pp.by_sender
        bad_payload = sum(d["bad"] for d in pp.by_sender.values())
    print(json.dumps(out))
    ok = total["icrc_bad"] == 0 and total["truncated"] == 0 and total["packets"] and not bad_payload
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
