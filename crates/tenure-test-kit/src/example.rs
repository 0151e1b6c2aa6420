//! Running the examples of the package under test, for tests that check what they print.

use std::process::Command;

/// Runs the built example `name` (examples are built next to the test binaries'
/// directory: target/<profile>/examples) with `TENURE_LOG=error`, asserts that it
/// succeeded and returns its standard output.
pub fn run_example(name: &str) -> String {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target profile dir");
    let example = dir.join("examples").join(name);
    assert!(
        example.exists(),
        "build the examples first (cargo test does): {}",
        example.display()
    );
    let out = Command::new(&example)
        .env("TENURE_LOG", "error")
        .output()
        .expect("run the example");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}
