//! Errors that say what and where: one line on stderr naming the address, port, file or
//! environment variable involved and, where there is one, the fix; status 1. And a client
//! whose server does not answer says what it waits for and gives up after `--timeout`.
//! Everything on 127.0.0.0/8.

mod common;

use common::{run, run_with_env, TempDir};
use std::net::{TcpListener, UdpSocket};
use std::time::{Duration, Instant};

/// The one line of a failed command: status 1, `softverbs: ...`, no panic.
fn one_line_error(code: i32, err: &str) -> &str {
    assert_eq!(code, 1, "{err}");
    assert!(
        err.lines().count() == 1 && err.starts_with("softverbs: ") && !err.contains("panicked"),
        "{err}"
    );
    err.trim_end()
}

#[test]
fn a_bad_softverbs_faults_names_the_variable_its_value_and_the_syntax() {
    for args in [&["pingpong", "-n", "5"][..], &["devinfo"][..]] {
        let (code, _, err) = run_with_env(args, &[("SOFTVERBS_FAULTS", "drop=lots")]);
        let line = one_line_error(code, &err);
        assert!(
            line.contains("SOFTVERBS_FAULTS=\"drop=lots\"")
                && line.contains("bad probability")
                && line.contains("drop=P"),
            "{args:?}: {line}"
        );
    }
}

#[test]
fn a_capture_in_a_missing_folder_names_the_file_and_the_folder() {
    let dir = TempDir::new("missing-folder");
    let file = dir.join("no/such/folder/run.pcap");
    let file_arg = file.to_str().unwrap();
    let folder = dir.join("no/such/folder");
    let folder = folder.to_str().unwrap();
    let (code, _, err) = run_with_env(&["pingpong", "-n", "5"], &[("SOFTVERBS_PCAP", file_arg)]);
    let line = one_line_error(code, &err);
    assert!(
        line.contains("SOFTVERBS_PCAP")
            && line.contains(file_arg)
            && line.contains(&format!("the folder {folder} does not exist")),
        "{line}"
    );
    let (code, _, err) = run(&["pingpong", "-n", "5", "--pcap", file_arg]);
    let line = one_line_error(code, &err);
    assert!(
        line.contains(file_arg) && line.contains(&format!("the folder {folder} does not exist")),
        "{line}"
    );
}

#[test]
fn a_device_address_in_use_names_the_address_the_port_and_the_fix() {
    // Something else holds 127.0.0.61:PORT; the device is asked for exactly that.
    let holder = UdpSocket::bind("127.0.0.61:0").expect("bind a UDP port on 127.0.0.61");
    let taken = holder.local_addr().unwrap().to_string();
    for args in [&["devinfo"][..], &["pingpong", "--server", "-p", "0"][..]] {
        let (code, _, err) = run_with_env(args, &[("SOFTVERBS_ADDR", &taken)]);
        let line = one_line_error(code, &err);
        assert!(
            line.contains(&format!("UDP {taken} is already in use"))
                && line.contains("SOFTVERBS_ADDR")
                && line.contains("--addr"),
            "{args:?}: {line}"
        );
    }
}

#[test]
fn a_malformed_softverbs_addr_names_the_variable_and_the_forms_it_takes() {
    let (code, _, err) = run_with_env(
        &["pingpong", "--server", "-p", "0"],
        &[("SOFTVERBS_ADDR", "127.0.0.300")],
    );
    let line = one_line_error(code, &err);
    assert!(
        line.contains("SOFTVERBS_ADDR=\"127.0.0.300\"") && line.contains("IP:PORT"),
        "{line}"
    );
}

#[test]
fn a_tcp_port_in_use_names_the_port_and_the_fix() {
    let holder = TcpListener::bind("127.0.0.1:0").expect("bind a TCP port");
    let port = holder.local_addr().unwrap().port().to_string();
    for command in ["pingpong", "perf"] {
        let mut args = vec![command];
        if command == "perf" {
            args.extend(["send", "lat"]);
        }
        args.extend(["--server", "-p", &port, "--listen", "127.0.0.1"]);
        let (code, _, err) = run(&args);
        let line = one_line_error(code, &err);
        assert!(
            line.contains(&format!("TCP 127.0.0.1:{port}"))
                && line.contains("already in use")
                && line.contains("-p/--port")
                && line.contains("-p 0"),
            "{args:?}: {line}"
        );
    }
}

#[test]
fn a_client_says_what_it_waits_for_and_gives_up_after_its_timeout() {
    // A port nobody listens on: bound, then let go.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    for args in [
        vec![
            "pingpong",
            "--client",
            "127.0.0.1",
            "-p",
            &port,
            "--timeout",
            "1",
        ],
        vec![
            "perf",
            "send",
            "lat",
            "--client",
            "127.0.0.1",
            "-p",
            &port,
            "--timeout",
            "1",
        ],
    ] {
        let started = Instant::now();
        let (code, out, err) = run(&args);
        let took = started.elapsed();
        assert_eq!(code, 1, "{args:?}:\n{out}\n{err}");
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_secs(10),
            "{args:?} took {took:?}"
        );
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 2, "{err}");
        assert!(
            lines[0].contains(&format!("waiting for the server on TCP 127.0.0.1:{port}"))
                && lines[0].contains("--timeout"),
            "{err}"
        );
        assert!(
            lines[1].contains(&format!(
                "no server answered on TCP 127.0.0.1:{port} within 1 s"
            )) && lines[1].contains("--server"),
            "{err}"
        );
    }
}
