//! Test-only: the ICRC test vectors of reference §1.8, as full IP packets, and a hex decoder.
//!
//! Every vector ends with its 4-byte ICRC as sent on the wire (least-significant byte
//! first). Sources are given per vector; see the reference for how they were verified.

/// Decodes a hex string, ignoring whitespace.
pub(crate) fn hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

/// Vector A (ConnectX, `ibdump`, magnate3/linux-riscv-dev read2.pcap): RC SEND_ONLY, QPN
/// 0x169, PSN 0x6af7e4, A=1, 16-byte payload.
pub(crate) const A_SEND_ONLY: &str = "4502003c469440004011b78fac11f22fac11f238f7c712b7002800000440ffff00000169806af7e460a361bca855000016000000200e0100b111a808";
/// Vector A: RC ACKNOWLEDGE, AETH 00 000001 (ACK, credit code 0, MSN 1).
pub(crate) const A_ACKNOWLEDGE: &str = "456a00304dfe40004011afc9ac11f238ac11f22ff7c712b7001c00001140ffff00000139006af7e400000001c87bcd56";
/// Vector A: RC RDMA_WRITE_ONLY, RETH VA 0x000055f4e59cedb0, R_Key 0x0001350d, length 22;
/// PadCnt 2.
pub(crate) const A_WRITE_ONLY: &str = "45020054469640004011b775ac11f22fac11f238f7c712b7004000000a60ffff00000169806af7e5000055f4e59cedb00001350d0000001674657874737472696e67646f676868686868676867670000825ff40c";
/// Vector A: RC RDMA_READ_REQUEST, RETH length 22.
pub(crate) const A_READ_REQUEST: &str = "4502003c469740004011b78cac11f22fac11f238f7c712b7002800000c40ffff00000169806af7e6000055f4e59cedb00001350d00000016fc5e34e6";
/// Vector A: RC RDMA_READ_RESPONSE_ONLY, AETH 00 000003, 22 bytes + 2 pad.
pub(crate) const A_READ_RESPONSE_ONLY: &str = "456a00484e0140004011afaeac11f238ac11f22ff7c712b7003400001060ffff00000139006af7e60000000374657874737472696e67646f676868686868676867670000801a9c8a";

/// Vector B (ConnectX-4 Lx CNP, secdev/scapy test/contrib/roce.uts): the full Ethernet
/// frame; the IP packet starts at byte 14.
pub(crate) const B_CNP_FRAME: &str =
    "e41d2dab2bc27cfe90643b32080045c2003c718c400040119161 0a0011010a001201 000012b700280000
8100ffff40000118 00000000 00000000000000000000000000000000 82fd002a";

/// Vector C (scapy-generated UC SEND_ONLY, reconstructed IP packet): PadCnt 2 with 20 bytes
/// after the BTH.
pub(crate) const C_SCAPY_UC_SEND_ONLY: &str = "45010040047840004011b4d5c0a80007c0a80007c00012b7002c00002460ffff000000d300cf17104630818be28935d90e9a95505401be885e50000078f353f3";

/// Vector D (synthetic IPv6): RC SEND_ONLY "ABCD", 2001:db8::1 → 2001:db8::2, traffic class
/// 0, flow label 0x12345, hop limit 64, sport 0xC001, DestQP 0x11, PSN 0x100, A=1.
pub(crate) const D_IPV6_SEND_ONLY: &str = "60012345001c114020010db800000000000000000000000120010db8000000000000000000000002c00112b7001c00000400ffff00000011800001004142434466779c57";

/// Every vector as an IP packet (vector B without its Ethernet header).
pub(crate) fn all_ip_packets() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("A send only", hex(A_SEND_ONLY)),
        ("A acknowledge", hex(A_ACKNOWLEDGE)),
        ("A write only", hex(A_WRITE_ONLY)),
        ("A read request", hex(A_READ_REQUEST)),
        ("A read response only", hex(A_READ_RESPONSE_ONLY)),
        ("B cnp", hex(B_CNP_FRAME)[14..].to_vec()),
        ("C scapy uc send only", hex(C_SCAPY_UC_SEND_ONLY)),
        ("D ipv6 send only", hex(D_IPV6_SEND_ONLY)),
    ]
}
