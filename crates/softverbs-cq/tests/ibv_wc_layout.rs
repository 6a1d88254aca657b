//! `WorkCompletion` and its enums against the installed `<infiniband/verbs.h>`.
//!
//! The C drop-in hands `WorkCompletion`s to C callers as `struct ibv_wc` with no conversion,
//! so the layout (size, alignment, the offset and size of every field) and every enum value
//! must be the header's. These tests compile a small C program against the real header (and
//! link it with the real libibverbs for `ibv_wc_status_str(3)`), run it, and compare what it
//! prints with the Rust types. The enum members are read out of the header itself, so a
//! newer header that adds one fails here until the Rust enum names it.
//!
//! Needs a C compiler and `libibverbs-dev` (the project's test command installs it); a
//! missing header is a failure, never a skip.

use softverbs_cq::{WcFields, WcFlags, WcOpcode, WcStatus, WorkCompletion};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const VERBS_H: &str = "/usr/include/infiniband/verbs.h";

/// The fields of `struct ibv_wc`, in declaration order, with the C member that reads each
/// (`imm_data` and `invalidated_rkey` are one anonymous union; `imm_data` stands for it).
const FIELDS: [&str; 13] = [
    "wr_id",
    "status",
    "opcode",
    "vendor_err",
    "byte_len",
    "imm_data",
    "qp_num",
    "src_qp",
    "wc_flags",
    "pkey_index",
    "slid",
    "sl",
    "dlid_path_bits",
];

/// What the C program printed: `name value` pairs, and `ibv_wc_status_str` texts.
struct Header {
    values: BTreeMap<String, u64>,
    status_str: BTreeMap<u32, String>,
    /// Members of each enum, in header order.
    enums: BTreeMap<&'static str, Vec<String>>,
}

impl Header {
    fn value(&self, name: &str) -> u64 {
        *self
            .values
            .get(name)
            .unwrap_or_else(|| panic!("the C program printed no value for {name}"))
    }
}

/// The enums whose members are compared, read from the header.
const ENUMS: [&str; 4] = [
    "ibv_wc_status",
    "ibv_wc_opcode",
    "ibv_wc_flags",
    "ibv_create_cq_wc_flags",
];

/// The member names of `enum <name> { ... };` in the header text.
fn enum_members(header: &str, name: &str) -> Vec<String> {
    let open = format!("enum {name} {{");
    let start = header
        .find(&open)
        .unwrap_or_else(|| panic!("{VERBS_H} has no `{open}`"))
        + open.len();
    let end = start + header[start..].find("};").expect("enum body ends");
    let mut body = String::new();
    let mut rest = &header[start..end];
    // Drop /* ... */ and // comments.
    while let Some(i) = rest.find("/*") {
        body.push_str(&rest[..i]);
        let close = rest[i..].find("*/").expect("comment ends");
        rest = &rest[i + close + 2..];
    }
    body.push_str(rest);
    body.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
        .split(',')
        .map(|member| member.split('=').next().unwrap_or("").trim().to_string())
        .filter(|member| !member.is_empty())
        .collect()
}

/// Compiles and runs the C program once per test binary.
fn header() -> &'static Header {
    static HEADER: OnceLock<Header> = OnceLock::new();
    HEADER.get_or_init(build_and_run)
}

fn build_and_run() -> Header {
    let text = std::fs::read_to_string(VERBS_H).unwrap_or_else(|e| {
        panic!(
            "cannot read {VERBS_H} ({e}): install libibverbs-dev (apt-get install \
             libibverbs-dev); the layout of WorkCompletion must be checked against it"
        )
    });
    let enums: BTreeMap<&'static str, Vec<String>> = ENUMS
        .iter()
        .map(|&name| (name, enum_members(&text, name)))
        .collect();

    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <stdalign.h>\n\
         #include <infiniband/verbs.h>\n\
         #define V(name, value) printf(\"%s %llu\\n\", name, (unsigned long long)(value))\n\
         int main(void) {\n\
         struct ibv_wc wc;\n\
         V(\"sizeof\", sizeof(struct ibv_wc));\n\
         V(\"alignof\", alignof(struct ibv_wc));\n",
    );
    for field in FIELDS.iter().chain(&["invalidated_rkey"]) {
        c += &format!("V(\"offsetof.{field}\", offsetof(struct ibv_wc, {field}));\n");
        c += &format!("V(\"sizeof.{field}\", sizeof(wc.{field}));\n");
    }
    for member in enums.values().flatten() {
        c += &format!("V(\"{member}\", {member});\n");
    }
    c += "V(\"IBV_WC_STANDARD_FLAGS\", IBV_WC_STANDARD_FLAGS);\n";
    c += "V(\"IBV_CREATE_CQ_SUP_WC_FLAGS\", IBV_CREATE_CQ_SUP_WC_FLAGS);\n";
    c += "for (int i = 0; i <= 30; i++)\n\
          printf(\"status_str %d\\t%s\\n\", i, ibv_wc_status_str((enum ibv_wc_status)i));\n\
          return 0;\n}\n";

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ibv_wc_layout");
    std::fs::create_dir_all(&dir).expect("create the C program's directory");
    let source = dir.join("ibv_wc_layout.c");
    let program = dir.join("ibv_wc_layout");
    std::fs::write(&source, c).expect("write the C program");
    compile(&source, &program);
    let out = Command::new(&program)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    assert!(
        out.status.success(),
        "{} failed: {}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );

    let mut values = BTreeMap::new();
    let mut status_str = BTreeMap::new();
    for line in String::from_utf8(out.stdout).expect("UTF-8 output").lines() {
        if let Some(rest) = line.strip_prefix("status_str ") {
            let (i, text) = rest.split_once('\t').expect("status_str line");
            status_str.insert(i.parse().expect("status number"), text.to_string());
        } else {
            let (name, value) = line.split_once(' ').expect("name value line");
            values.insert(name.to_string(), value.parse().expect("number"));
        }
    }
    Header {
        values,
        status_str,
        enums,
    }
}

fn compile(source: &Path, program: &Path) {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = Command::new(&cc)
        .arg("-std=c11")
        .arg("-Wall")
        .arg("-o")
        .arg(program)
        .arg(source)
        .arg("-libverbs")
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}` ({e}): install gcc"));
    assert!(
        out.status.success(),
        "compiling against {VERBS_H} failed (install libibverbs-dev):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Where each field of `WorkCompletion` lies, found without naming its private fields: a
/// 48-byte buffer whose byte `i` holds `i + 1` is read as a `WorkCompletion`, and each
/// field's value then says which bytes it came from. Returns (offset, size) per field, in
/// [`FIELDS`] order.
fn rust_field_spans() -> [(usize, usize); 13] {
    assert_eq!(std::mem::size_of::<WorkCompletion>(), 48);
    let mut image = [0u8; 48];
    for (i, byte) in image.iter_mut().enumerate() {
        *byte = i as u8 + 1;
    }
    // SAFETY: `image` is 48 initialised bytes, exactly `size_of::<WorkCompletion>()` (checked
    // above); every field of the `repr(C)` struct is an integer, for which any bit pattern is
    // valid, and `read_unaligned` needs no alignment.
    let wc: WorkCompletion = unsafe { std::ptr::read_unaligned(image.as_ptr().cast()) };
    let r = wc.raw();
    let spans: [Vec<u8>; 13] = [
        r.wr_id.to_ne_bytes().to_vec(),
        r.status.to_ne_bytes().to_vec(),
        r.opcode.to_ne_bytes().to_vec(),
        r.vendor_err.to_ne_bytes().to_vec(),
        r.byte_len.to_ne_bytes().to_vec(),
        r.imm_or_rkey.to_ne_bytes().to_vec(),
        r.qp_num.to_ne_bytes().to_vec(),
        r.src_qp.to_ne_bytes().to_vec(),
        r.wc_flags.to_ne_bytes().to_vec(),
        r.pkey_index.to_ne_bytes().to_vec(),
        r.slid.to_ne_bytes().to_vec(),
        vec![r.sl],
        vec![r.dlid_path_bits],
    ];
    std::array::from_fn(|f| {
        let bytes = &spans[f];
        let offset = usize::from(bytes[0]) - 1;
        for (k, &b) in bytes.iter().enumerate() {
            assert_eq!(
                usize::from(b),
                offset + k + 1,
                "field {} is not one contiguous run of bytes",
                FIELDS[f]
            );
        }
        (offset, bytes.len())
    })
}

#[test]
fn work_completion_has_the_size_and_alignment_of_struct_ibv_wc() {
    // ibv_poll_cq(3): "wc: array of at least num_entries of struct ibv_wc" — the C drop-in
    // hands the caller's array straight to the poller, so the element size must match.
    let h = header();
    assert_eq!(
        std::mem::size_of::<WorkCompletion>() as u64,
        h.value("sizeof")
    );
    assert_eq!(
        std::mem::align_of::<WorkCompletion>() as u64,
        h.value("alignof")
    );
}

#[test]
fn every_work_completion_field_is_at_the_offset_and_size_of_struct_ibv_wc() {
    // verbs.h: struct ibv_wc { uint64_t wr_id; enum ibv_wc_status status; enum ibv_wc_opcode
    // opcode; uint32_t vendor_err; uint32_t byte_len; union { __be32 imm_data; uint32_t
    // invalidated_rkey; }; uint32_t qp_num; uint32_t src_qp; unsigned int wc_flags; uint16_t
    // pkey_index; uint16_t slid; uint8_t sl; uint8_t dlid_path_bits; };
    let h = header();
    for (field, (offset, size)) in FIELDS.iter().zip(rust_field_spans()) {
        assert_eq!(
            (offset as u64, size as u64),
            (
                h.value(&format!("offsetof.{field}")),
                h.value(&format!("sizeof.{field}"))
            ),
            "WorkCompletion.{field}: (offset, size) in Rust vs verbs.h"
        );
    }
    // The union: invalidated_rkey shares imm_data's bytes.
    assert_eq!(
        h.value("offsetof.invalidated_rkey"),
        h.value("offsetof.imm_data")
    );
    assert_eq!(h.value("sizeof.invalidated_rkey"), 4);
}

/// Asserts every member of header enum `name` is in `rust` with the same value, and that
/// the Rust side names nothing the header lacks except `extra`.
fn assert_enum_matches(name: &str, rust: &[(&str, u64)], extra: &[&str]) {
    let h = header();
    let members = &h.enums[name];
    assert!(
        !members.is_empty(),
        "enum {name} has no members in {VERBS_H}"
    );
    let rust: BTreeMap<&str, u64> = rust.iter().copied().collect();
    for member in members {
        let value = rust
            .get(member.as_str())
            .unwrap_or_else(|| panic!("enum {name}: {member} has no Rust counterpart"));
        assert_eq!(*value, h.value(member), "enum {name}: {member}");
    }
    for rust_name in rust.keys() {
        assert!(
            members.iter().any(|m| m == rust_name) || extra.contains(rust_name),
            "enum {name}: Rust names {rust_name}, the header does not"
        );
    }
}

#[test]
fn wc_status_values_are_enum_ibv_wc_status() {
    // verbs.h: enum ibv_wc_status { IBV_WC_SUCCESS, IBV_WC_LOC_LEN_ERR, ... }.
    let names = [
        "IBV_WC_SUCCESS",
        "IBV_WC_LOC_LEN_ERR",
        "IBV_WC_LOC_QP_OP_ERR",
        "IBV_WC_LOC_EEC_OP_ERR",
        "IBV_WC_LOC_PROT_ERR",
        "IBV_WC_WR_FLUSH_ERR",
        "IBV_WC_MW_BIND_ERR",
        "IBV_WC_BAD_RESP_ERR",
        "IBV_WC_LOC_ACCESS_ERR",
        "IBV_WC_REM_INV_REQ_ERR",
        "IBV_WC_REM_ACCESS_ERR",
        "IBV_WC_REM_OP_ERR",
        "IBV_WC_RETRY_EXC_ERR",
        "IBV_WC_RNR_RETRY_EXC_ERR",
        "IBV_WC_LOC_RDD_VIOL_ERR",
        "IBV_WC_REM_INV_RD_REQ_ERR",
        "IBV_WC_REM_ABORT_ERR",
        "IBV_WC_INV_EECN_ERR",
        "IBV_WC_INV_EEC_STATE_ERR",
        "IBV_WC_FATAL_ERR",
        "IBV_WC_RESP_TIMEOUT_ERR",
        "IBV_WC_GENERAL_ERR",
        "IBV_WC_TM_ERR",
        "IBV_WC_TM_RNDV_INCOMPLETE",
    ];
    let variants = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocEecOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::MwBindErr,
        WcStatus::BadRespErr,
        WcStatus::LocAccessErr,
        WcStatus::RemInvReqErr,
        WcStatus::RemAccessErr,
        WcStatus::RemOpErr,
        WcStatus::RetryExcErr,
        WcStatus::RnrRetryExcErr,
        WcStatus::LocRddViolErr,
        WcStatus::RemInvRdReqErr,
        WcStatus::RemAbortErr,
        WcStatus::InvEecnErr,
        WcStatus::InvEecStateErr,
        WcStatus::FatalErr,
        WcStatus::RespTimeoutErr,
        WcStatus::GeneralErr,
        WcStatus::TmErr,
        WcStatus::TmRndvIncomplete,
    ];
    assert_eq!(variants.as_slice(), WcStatus::ALL.as_slice());
    let rust: Vec<(&str, u64)> = names
        .iter()
        .zip(variants)
        .map(|(n, v)| (*n, u64::from(v.to_raw())))
        .collect();
    assert_enum_matches("ibv_wc_status", &rust, &[]);
    for (name, variant) in names.iter().zip(variants) {
        let raw = header().value(name) as u32;
        assert_eq!(WcStatus::from_raw(raw), variant, "{name}");
    }
}

#[test]
fn wc_status_text_is_what_ibv_wc_status_str_returns() {
    // ibv_wc_status_str(3): "returns a string describing the enum value status"; the real
    // libibverbs function is called for 0..=30 (past the last status it says "unknown").
    let h = header();
    assert_eq!(h.status_str.len(), 31);
    for (&raw, text) in &h.status_str {
        assert_eq!(
            WcStatus::from_raw(raw).as_str(),
            text,
            "ibv_wc_status_str({raw})"
        );
    }
}

#[test]
fn wc_opcode_values_are_enum_ibv_wc_opcode() {
    // verbs.h: "Set value of IBV_WC_RECV so consumers can test if a completion is a receive
    // by testing (opcode & IBV_WC_RECV)."
    let table = [
        ("IBV_WC_SEND", WcOpcode::Send),
        ("IBV_WC_RDMA_WRITE", WcOpcode::RdmaWrite),
        ("IBV_WC_RDMA_READ", WcOpcode::RdmaRead),
        ("IBV_WC_COMP_SWAP", WcOpcode::CompSwap),
        ("IBV_WC_FETCH_ADD", WcOpcode::FetchAdd),
        ("IBV_WC_BIND_MW", WcOpcode::BindMw),
        ("IBV_WC_LOCAL_INV", WcOpcode::LocalInv),
        ("IBV_WC_TSO", WcOpcode::Tso),
        ("IBV_WC_FLUSH", WcOpcode::Flush),
        ("IBV_WC_ATOMIC_WRITE", WcOpcode::AtomicWrite),
        ("IBV_WC_RECV", WcOpcode::Recv),
        ("IBV_WC_RECV_RDMA_WITH_IMM", WcOpcode::RecvRdmaWithImm),
        ("IBV_WC_TM_ADD", WcOpcode::TmAdd),
        ("IBV_WC_TM_DEL", WcOpcode::TmDel),
        ("IBV_WC_TM_SYNC", WcOpcode::TmSync),
        ("IBV_WC_TM_RECV", WcOpcode::TmRecv),
        ("IBV_WC_TM_NO_TAG", WcOpcode::TmNoTag),
        ("IBV_WC_DRIVER1", WcOpcode::Driver1),
        ("IBV_WC_DRIVER2", WcOpcode::Driver2),
        ("IBV_WC_DRIVER3", WcOpcode::Driver3),
    ];
    let rust: Vec<(&str, u64)> = table
        .iter()
        .map(|(n, v)| (*n, u64::from(v.to_raw())))
        .collect();
    // IBV_WC_FLUSH (8) is newer than Debian 12's header, which leaves 8 unnamed.
    assert_enum_matches("ibv_wc_opcode", &rust, &["IBV_WC_FLUSH"]);
    let h = header();
    for (name, variant) in table {
        if h.values.contains_key(name) {
            assert_eq!(WcOpcode::from_raw(h.value(name) as u32), variant, "{name}");
        }
    }
    for (name, variant) in table {
        let receive = h.values.get(name).map(|v| v & h.value("IBV_WC_RECV") != 0);
        assert!(receive.is_none_or(|r| r == variant.is_receive()), "{name}");
    }
}

#[test]
fn wc_flags_values_are_enum_ibv_wc_flags() {
    // verbs.h: enum ibv_wc_flags { IBV_WC_GRH = 1 << 0, IBV_WC_WITH_IMM = 1 << 1, ... }.
    let table = [
        ("IBV_WC_GRH", WcFlags::GRH),
        ("IBV_WC_WITH_IMM", WcFlags::WITH_IMM),
        ("IBV_WC_IP_CSUM_OK", WcFlags::IP_CSUM_OK),
        ("IBV_WC_WITH_INV", WcFlags::WITH_INV),
        ("IBV_WC_TM_SYNC_REQ", WcFlags::TM_SYNC_REQ),
        ("IBV_WC_TM_MATCH", WcFlags::TM_MATCH),
        ("IBV_WC_TM_DATA_VALID", WcFlags::TM_DATA_VALID),
    ];
    let rust: Vec<(&str, u64)> = table
        .iter()
        .map(|(n, v)| (*n, u64::from(v.bits())))
        .collect();
    assert_enum_matches("ibv_wc_flags", &rust, &[]);
}

#[test]
fn wc_fields_values_are_enum_ibv_create_cq_wc_flags() {
    // ibv_create_cq_ex(3): "wc_flags: Bitmask of enum ibv_create_cq_wc_flags which says
    // what fields of the work completion the user wants to read."
    let table = [
        ("IBV_WC_EX_WITH_BYTE_LEN", WcFields::BYTE_LEN),
        ("IBV_WC_EX_WITH_IMM", WcFields::IMM),
        ("IBV_WC_EX_WITH_QP_NUM", WcFields::QP_NUM),
        ("IBV_WC_EX_WITH_SRC_QP", WcFields::SRC_QP),
        ("IBV_WC_EX_WITH_SLID", WcFields::SLID),
        ("IBV_WC_EX_WITH_SL", WcFields::SL),
        ("IBV_WC_EX_WITH_DLID_PATH_BITS", WcFields::DLID_PATH_BITS),
        (
            "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP",
            WcFields::COMPLETION_TIMESTAMP,
        ),
        ("IBV_WC_EX_WITH_CVLAN", WcFields::CVLAN),
        ("IBV_WC_EX_WITH_FLOW_TAG", WcFields::FLOW_TAG),
        ("IBV_WC_EX_WITH_TM_INFO", WcFields::TM_INFO),
        (
            "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK",
            WcFields::COMPLETION_TIMESTAMP_WALLCLOCK,
        ),
    ];
    let rust: Vec<(&str, u64)> = table.iter().map(|(n, v)| (*n, v.bits())).collect();
    assert_enum_matches("ibv_create_cq_wc_flags", &rust, &[]);
}

#[test]
fn standard_and_supported_wc_fields_are_the_headers() {
    // verbs.h: IBV_WC_STANDARD_FLAGS (the fields every struct ibv_wc carries) and
    // IBV_CREATE_CQ_SUP_WC_FLAGS (every flag ibv_create_cq_ex accepts).
    let h = header();
    assert_eq!(WcFields::STANDARD.bits(), h.value("IBV_WC_STANDARD_FLAGS"));
    assert_eq!(
        WcFields::all().bits(),
        h.value("IBV_CREATE_CQ_SUP_WC_FLAGS")
    );
}
