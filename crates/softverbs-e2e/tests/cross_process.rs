//! Two processes on one host, each with its own automatically chosen 127.0.0.x device
//! address (several processes on one host work with nothing configured),
//! running the verifying mixed-opcode RC workload over real RoCEv2/UDP.

mod common;

use common::*;
use std::process::Stdio;
use std::time::Duration;

#[test]
fn two_processes_run_a_verified_mixed_opcode_workload_with_nothing_configured() {
    let mut server = peer();
    server.arg("--server").env_remove("SOFTVERBS_ADDR");
    let mut server = start_server(server);
    let client = peer()
        .args([
            "--client",
            "127.0.0.1",
            "--port",
            &server.port.to_string(),
            "-n",
            "6000",
        ])
        .env_remove("SOFTVERBS_ADDR")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the client");
    let (code, out) = finish(client, None, Duration::from_secs(120));
    assert_eq!(code, 0, "client: {out}");
    assert!(
        out.starts_with("OK client: 6000 messages verified"),
        "{out}"
    );
    let (code, out) = finish(
        server.child,
        Some(&mut server.stdout),
        Duration::from_secs(30),
    );
    assert_eq!(code, 0, "server: {out}");
    assert!(
        out.contains("OK server: 6000 messages, 2000 sends verified"),
        "{out}"
    );
}

#[test]
fn a_peer_killed_mid_run_gives_the_survivor_retry_exceeded_then_flushes() {
    // ibv_poll_cq(3) / IBTA 9.7.5.1.3: when the responder stops answering, the requester
    // retries retry_cnt times, completes the request with IBV_WC_RETRY_EXC_ERR, moves the
    // QP to the error state and flushes every later request with IBV_WC_WR_FLUSH_ERR.
    let mut server = peer();
    server.arg("--server");
    let mut server = start_server(server);
    let mut client = peer()
        .args([
            "--client",
            "127.0.0.1",
            "--port",
            &server.port.to_string(),
            "-n",
            "100000000",
            "--timeout-code",
            "13",
            "--retry-cnt",
            "3",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the client");
    std::thread::sleep(Duration::from_millis(300));
    if client.try_wait().unwrap().is_some() {
        let (code, out) = finish(client, None, Duration::from_secs(1));
        panic!("the client ended before the kill: {code} {out}");
    }
    server.child.kill().expect("kill the server");
    let _ = server.child.wait();
    let (code, out) = finish(client, None, Duration::from_secs(30));
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("FAILED: transport retry counter exceeded"),
        "{out}"
    );
    assert!(out.contains("flushed") && out.contains("other []"), "{out}");
}
