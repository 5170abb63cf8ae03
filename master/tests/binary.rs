//! The `agora-master` binary: announces its port, serves, refuses bad flags.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_agora-master");

#[test]
fn prints_listen_line_and_serves_health() {
    let mut child = Command::new(BIN)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--allocation-interval",
            "500ms",
            "--offer-timeout",
            "2m",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("agora-master listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    let response = agora_client::blocking::get(&addr, "/health");
    let _ = child.kill();
    let _ = child.wait();
    let response = response.unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.text(), "ok");
}

#[test]
fn bad_flags_exit_non_zero_with_a_message() {
    for args in [
        vec!["--allocation-interval", "soon"],
        vec!["--max-missed-pings", "0"],
        vec!["--weights", "web"],
        vec!["--no-such-flag"],
    ] {
        let out = Command::new(BIN).args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?} accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.trim().is_empty(), "{args:?}: no message");
    }
}
