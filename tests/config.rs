//! Configuration at the binary's edge: a bad setting is a clear error and exit code 1, never a
//! panic.

use std::process::Command;

/// `HOOKRELAY_MANAGEMENT_URL=localhost:15672` (no scheme) once loaded and then panicked at the
/// first management request.
#[test]
fn a_management_url_without_a_scheme_is_a_configuration_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_hookrelay"))
        .args(["topology", "plan"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("HOOKRELAY_MANAGEMENT_URL", "localhost:15672")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("invalid setting management.url"),
        "{stderr}"
    );
}
