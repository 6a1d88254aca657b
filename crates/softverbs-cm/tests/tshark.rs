//! Wireshark decodes the MADs this crate writes as the CM messages they are: each MAD is
//! wrapped in a RoCEv2 UD SEND_ONLY to QP 1 (BTH opcode 0x64, DETH Q_Key 0x80010000,
//! source QP 1; reference rocev2.md §1) in an IPv4/UDP 4791 packet of a pcap, and `tshark`
//! must name the message and show its fields (IBTA 12.6 layouts checked by a second,
//! independent decoder). The test fails — it does not skip — when tshark is missing.

use std::path::PathBuf;
use std::process::Command;

use softverbs_cm::mad::{
    self, reject_reason, Drep, Dreq, MessageKind, Rej, Rep, Req, ReqPath, Rtu, MAD_LEN,
};

/// Ethernet + IPv4 + UDP(4791) + BTH + DETH + MAD + ICRC (zero: Wireshark does not check it).
fn rocev2_gsi_packet(mad: &[u8; MAD_LEN]) -> Vec<u8> {
    let mut ib = Vec::new();
    // BTH: opcode 0x64 (UD SEND_ONLY), SE/M/pad/TVer 0, P_Key 0xFFFF, DestQP 1, PSN 0.
    ib.extend_from_slice(&[0x64, 0x00, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x01, 0, 0, 0, 0]);
    // DETH: Q_Key 0x80010000, source QP 1.
    ib.extend_from_slice(&[0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01]);
    ib.extend_from_slice(mad);
    ib.extend_from_slice(&[0; 4]);
    let udp_len = 8 + ib.len();
    let ip_len = 20 + udp_len;
    let mut p = Vec::new();
    p.extend_from_slice(&[0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00]);
    let mut ip = vec![
        0x45,
        0,
        (ip_len >> 8) as u8,
        ip_len as u8,
        0,
        0,
        0x40,
        0,
        64,
        17,
        0,
        0,
        127,
        0,
        0,
        1,
        127,
        0,
        0,
        2,
    ];
    let sum: u32 = ip
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    let folded = !(((sum & 0xFFFF) + (sum >> 16)) as u16);
    ip[10..12].copy_from_slice(&folded.to_be_bytes());
    p.extend_from_slice(&ip);
    p.extend_from_slice(&[
        0xC0,
        0x00,
        0x12,
        0xB7,
        (udp_len >> 8) as u8,
        udp_len as u8,
        0,
        0,
    ]);
    p.extend_from_slice(&ib);
    p
}

fn write_pcap(name: &str, packets: &[Vec<u8>]) -> PathBuf {
    let mut f = Vec::new();
    f.extend_from_slice(&0xA1B2_C3D4u32.to_le_bytes());
    f.extend_from_slice(&2u16.to_le_bytes());
    f.extend_from_slice(&4u16.to_le_bytes());
    f.extend_from_slice(&0i32.to_le_bytes());
    f.extend_from_slice(&0u32.to_le_bytes());
    f.extend_from_slice(&65535u32.to_le_bytes());
    f.extend_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
    for (i, p) in packets.iter().enumerate() {
        f.extend_from_slice(&(i as u32).to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        f.extend_from_slice(&(p.len() as u32).to_le_bytes());
        f.extend_from_slice(&(p.len() as u32).to_le_bytes());
        f.extend_from_slice(p);
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("{name}-{}.pcap", std::process::id()));
    std::fs::write(&path, f).expect("write pcap");
    path
}

/// `tshark -T fields` for each packet: one line per packet, fields tab-separated.
fn tshark_fields(pcap: &PathBuf, fields: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(pcap)
        .args(["-T", "fields", "-E", "separator=\t"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd
        .output()
        .expect("tshark must be installed for this test (apt-get install -y tshark)");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect()
}

fn tshark_verbose(pcap: &PathBuf) -> String {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(pcap)
        .arg("-V")
        .output()
        .expect("tshark must be installed for this test (apt-get install -y tshark)");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn mad_of(write: impl FnOnce(&mut [u8; MAD_LEN])) -> [u8; MAD_LEN] {
    let mut m = [0u8; MAD_LEN];
    write(&mut m);
    m
}

fn gid_v4(a: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xFF;
    g[11] = 0xFF;
    g[12..].copy_from_slice(&a);
    g
}

#[test]
fn tshark_decodes_req_rep_rtu_rej_dreq_drep_with_their_ibta_12_6_fields() {
    let cma = softverbs_cm::cma::CmaHeader {
        src_port: 0xBEEF,
        addresses: softverbs_cm::cma::CmaAddresses::V4 {
            src: [127, 0, 0, 1].into(),
            dst: [127, 0, 0, 2].into(),
        },
    };
    let req = Req {
        transaction_id: 0x0000_1234_0000_0042,
        local_comm_id: 0x0A0B_0C0D,
        service_id: softverbs_cm::cma::service_id(softverbs_cm::cma::RDMA_PS_TCP, 7471),
        local_ca_guid: 0x0011_2233_4455_6677,
        local_qkey: 0,
        local_qpn: 0x000123,
        responder_resources: 4,
        local_eecn: 0,
        initiator_depth: 2,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_service_type: 0,
        end_to_end_flow_control: true,
        starting_psn: 0x00ABCD,
        local_cm_response_timeout: 19,
        retry_count: 7,
        partition_key: 0xFFFF,
        path_mtu: 3,
        rdc_exists: false,
        rnr_retry_count: 6,
        max_cm_retries: 15,
        srq: false,
        extended_transport_type: 0,
        primary_path: ReqPath {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: gid_v4([127, 0, 0, 1]),
            remote_gid: gid_v4([127, 0, 0, 2]),
            flow_label: 0x12345,
            packet_rate: 3,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: 18,
        },
        alternate_path: ReqPath::default(),
        sap_supported: false,
        private_data: mad::private_data(&cma.with_user_data(b"hello")).expect("fits"),
    };
    let rep = Rep {
        transaction_id: req.transaction_id,
        local_comm_id: 0x1111_2222,
        remote_comm_id: req.local_comm_id,
        local_qkey: 0,
        local_qpn: 0x000456,
        local_eecn: 0,
        starting_psn: 0x00DCBA,
        responder_resources: 2,
        initiator_depth: 4,
        target_ack_delay: 0,
        failover_accepted: 1,
        end_to_end_flow_control: true,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 0x8899_AABB_CCDD_EEFF,
        private_data: [0; mad::REP_PRIVATE_DATA_LEN],
    };
    let rtu = Rtu {
        transaction_id: 1,
        local_comm_id: req.local_comm_id,
        remote_comm_id: rep.local_comm_id,
        private_data: [0; mad::RTU_PRIVATE_DATA_LEN],
    };
    let rej = Rej {
        transaction_id: 2,
        local_comm_id: 0,
        remote_comm_id: 0x0A0B_0C0D,
        message_rejected: MessageKind::Req,
        reject_info_length: 0,
        reason: reject_reason::CONSUMER,
        ari: [0; mad::REJ_ARI_LEN],
        private_data: mad::private_data(b"go away").expect("fits"),
    };
    let dreq = Dreq {
        transaction_id: 3,
        local_comm_id: req.local_comm_id,
        remote_comm_id: rep.local_comm_id,
        remote_qpn: 0x000456,
        private_data: [0; mad::DREQ_PRIVATE_DATA_LEN],
    };
    let drep = Drep {
        transaction_id: 3,
        local_comm_id: rep.local_comm_id,
        remote_comm_id: req.local_comm_id,
        private_data: [0; mad::DREP_PRIVATE_DATA_LEN],
    };
    let packets = vec![
        rocev2_gsi_packet(&mad_of(|m| req.write(m))),
        rocev2_gsi_packet(&mad_of(|m| rep.write(m))),
        rocev2_gsi_packet(&mad_of(|m| rtu.write(m))),
        rocev2_gsi_packet(&mad_of(|m| rej.write(m))),
        rocev2_gsi_packet(&mad_of(|m| dreq.write(m))),
        rocev2_gsi_packet(&mad_of(|m| drep.write(m))),
    ];
    let pcap = write_pcap("cm-messages", &packets);

    let rows = tshark_fields(
        &pcap,
        &[
            "infiniband.bth.opcode",
            "infiniband.bth.destqp",
            "infiniband.deth.q_key",
            "infiniband.mad.mgmtclass",
            "infiniband.mad.classversion",
            "infiniband.mad.method",
            "infiniband.mad.attributeid",
            "infiniband.mad.transactionid",
        ],
    );
    assert_eq!(rows.len(), 6, "{rows:?}");
    let attributes = ["0x0010", "0x0013", "0x0014", "0x0012", "0x0015", "0x0016"];
    for (row, attr) in rows.iter().zip(attributes) {
        let want = ["0x64", "1", "0x80010000", "0x07", "2", "0x03", attr];
        for (got, want) in row.iter().zip(want) {
            assert!(same_value(got, want), "{row:?}: {got} is not {want}");
        }
    }
    assert!(same_value(&rows[0][7], "0x0000123400000042"));

    let req_row = &tshark_fields(
        &pcap,
        &[
            "infiniband.cm.req",
            "infiniband.cm.req.serviceid",
            "infiniband.cm.req.localcaguid",
            "infiniband.cm.req.localqpn",
            "infiniband.cm.req.responderres",
            "infiniband.cm.req.initdepth",
            "infiniband.cm.req.remoteresptout",
            "infiniband.cm.req.transpsvctype",
            "infiniband.cm.req.e2eflowctrl",
            "infiniband.cm.req.startpsn",
            "infiniband.cm.req.localresptout",
            "infiniband.cm.req.retrcount",
            "infiniband.cm.req.pkey",
            "infiniband.cm.req.pppmtu",
            "infiniband.cm.req.rnrretrcount",
            "infiniband.cm.req.maxcmretr",
            "infiniband.cm.req.prim_locallid",
            // Not prim_flowlabel / prim_pktrate: Wireshark 4.0 reads the 20-bit flow
            // label from 2 bytes and misplaces the packet rate; the kernel's layout
            // (ibta_vol1_c12.h: flow label 20 bits at 88, rate the low 6 bits of 91) is
            // pinned by the unit test of mad.rs instead.
            "infiniband.cm.req.prim_hoplim",
            "infiniband.cm.req.prim_localacktout",
            "infiniband.cm.req.ip_cm.sport",
            "infiniband.cm.req.ip_cm.sip4",
            "infiniband.cm.req.ip_cm.dip4",
        ],
    )[0];
    let want = [
        "0x0a0b0c0d",
        "0x0000000001061d2f",
        "0x0011223344556677",
        "0x000123",
        "0x04",
        "0x02",
        "20",
        "0",
        "1",
        "0x00abcd",
        "19",
        "7",
        "0xffff",
        "3",
        "6",
        "15",
        "0xffff",
        "0x40",
        "18",
        "48879",
        "127.0.0.1",
        "127.0.0.2",
    ];
    for (i, (got, want)) in req_row.iter().zip(want).enumerate() {
        // tshark prints some numbers in hex and some in decimal depending on its version:
        // compare numerically when both parse.
        assert!(
            same_value(got, want),
            "REQ field {i}: tshark {got:?}, want {want:?} (row {req_row:?})"
        );
    }

    let rep_row = &tshark_fields(
        &pcap,
        &[
            "infiniband.cm.rep",
            "infiniband.cm.rep.remotecommid",
            "infiniband.cm.rep.localqpn",
            "infiniband.cm.rep.startpsn",
            "infiniband.cm.rep.failoveracc",
            "infiniband.cm.rep.rnrretrcount",
            "infiniband.cm.rep.localcaguid",
        ],
    )[1];
    for (got, want) in rep_row.iter().zip([
        "0x11112222",
        "0x0a0b0c0d",
        "0x000456",
        "0x00dcba",
        "1",
        "7",
        "0x8899aabbccddeeff",
    ]) {
        assert!(same_value(got, want), "REP: {rep_row:?}");
    }

    let rej_row = &tshark_fields(
        &pcap,
        &[
            "infiniband.cm.rej.localcommid",
            "infiniband.cm.rej.remotecommid",
            "infiniband.cm.rej.msgrej",
            "infiniband.cm.rej.reason",
            "infiniband.cm.rej.private",
        ],
    )[3];
    assert!(same_value(&rej_row[1], "0x0a0b0c0d"), "{rej_row:?}");
    assert!(same_value(&rej_row[2], "0"), "{rej_row:?}");
    assert!(same_value(&rej_row[3], "28"), "{rej_row:?}");
    assert!(
        rej_row[4].starts_with("676f2061776179") || rej_row[4].starts_with("67:6f:20"),
        "REJ private data: {rej_row:?}"
    );

    let dreq_row = &tshark_fields(
        &pcap,
        &[
            "infiniband.cm.dreq.localcommid",
            "infiniband.cm.dreq.remotecommid",
            "infiniband.cm.req.remoteqpneecn",
        ],
    )[4];
    for (got, want) in dreq_row
        .iter()
        .zip(["0x0a0b0c0d", "0x11112222", "0x000456"])
    {
        assert!(same_value(got, want), "DREQ: {dreq_row:?}");
    }
    let drep_row = &tshark_fields(
        &pcap,
        &[
            "infiniband.cm.drsp.localcommid",
            "infiniband.cm.drsp.remotecommid",
        ],
    )[5];
    for (got, want) in drep_row.iter().zip(["0x11112222", "0x0a0b0c0d"]) {
        assert!(same_value(got, want), "DREP: {drep_row:?}");
    }
    let rtu_row = &tshark_fields(
        &pcap,
        &[
            "infiniband.cm.rtu.localcommid",
            "infiniband.cm.rtu.remotecommid",
        ],
    )[2];
    for (got, want) in rtu_row.iter().zip(["0x0a0b0c0d", "0x11112222"]) {
        assert!(same_value(got, want), "RTU: {rtu_row:?}");
    }

    let text = tshark_verbose(&pcap);
    for name in [
        "ConnectRequest",
        "ConnectReply",
        "ReadyToUse",
        "ConnectReject",
        "DisconnectRequest",
        "DisconnectReply",
    ] {
        assert!(
            text.contains(name),
            "tshark -V does not name {name}:\n{text}"
        );
    }
    let _ = std::fs::remove_file(&pcap);
}

fn parse_number(s: &str) -> Option<u128> {
    let s = s.trim();
    if let Some(hex) = s.strip_prefix("0x") {
        u128::from_str_radix(hex, 16).ok()
    } else {
        s.parse().ok()
    }
}

fn same_value(got: &str, want: &str) -> bool {
    match (parse_number(got), parse_number(want)) {
        (Some(a), Some(b)) => a == b,
        _ => got.eq_ignore_ascii_case(want),
    }
}
