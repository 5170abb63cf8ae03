//! The web UI in real headless Chromium: runs `tests/browser/ui.test.mjs`
//! (playwright-core driving Debian's `/usr/bin/chromium`) against a local
//! cluster started by `agora-local`. It loads the page, launches a
//! task, sees it appear and finish without reloading, and opens its stdout.
//!
//! Needs Node.js, `npm ci` in `tests/browser/` and Chromium (`.ci/run`
//! installs both). Without them the test is skipped with a message, except
//! under `CI=true`, where it fails.

mod support;

use std::path::Path;
use std::process::Command;

#[test]
fn web_ui_shows_a_task_finish_and_its_stdout() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/browser");
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let mut missing = Vec::new();
    if !Path::new(&chromium).is_file() {
        missing.push(format!("chromium ({chromium})"));
    }
    if !dir.join("node_modules/playwright-core").is_dir() {
        missing.push(format!("npm ci in {}", dir.display()));
    }
    if Command::new("node").arg("--version").output().is_err() {
        missing.push("node".to_string());
    }
    if !missing.is_empty() {
        let message = format!("browser test needs: {}", missing.join(", "));
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{message}");
        }
        eprintln!("skipped: {message}");
        return;
    }
    let output = Command::new("node")
        .arg("ui.test.mjs")
        .current_dir(&dir)
        .env("AGORA_BIN", support::bin("agora"))
        .env("AGORA_LOCAL_BIN", support::bin("agora-local"))
        .env("CHROMIUM", &chromium)
        .output()
        .expect("running node");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "browser test failed:\n{text}");
    assert!(text.contains("stdout shown"), "{text}");
}
