#!/usr/bin/env bash
# The test command of README.md: installs what the tests need, then checks formatting,
# lints and runs every test of the workspace; prints the time of each step at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's time, printed at the end (also when a step fails), then the tests' count.
times=()
current=""
log=$(mktemp)
step() {
  current=$1
  shift
  local start=$SECONDS
  echo "=== $current"
  "$@"
  times+=("$(printf '%6d s  %s' $((SECONDS - start)) "$current")")
  current=""
}
summary() {
  local status=$?
  echo
  echo "test command steps:"
  printf '%s\n' "${times[@]}"
  [ -z "$current" ] || echo "  failed in: $current"
  printf '%6d s  in all\n' "$SECONDS"
  # The tests' closing line: nextest's summaries and cargo test's results added up (a
  # failed test's own output, which nextest shows indented, is not counted again).
  local results passed failed
  results=$(grep -E '^ *Summary \[|^test result:' "$log" || true)
  passed=$( (grep -oE '[0-9]+ passed' <<<"$results" || true) | awk '{s += $1} END {print s + 0}')
  failed=$( (grep -oE '[0-9]+ failed' <<<"$results" || true) | awk '{s += $1} END {print s + 0}')
  rm -f "$log"
  echo "tests: $passed passed, $failed failed"
  exit "$status"
}
trap summary EXIT
# The output of a test run, also kept for the closing count.
counted() { "$@" 2>&1 | tee -a "$log"; }

# Tests need: cargo (with rustfmt and clippy), a C compiler for bundled SQLite, and
# util-linux's runuser (to check a read-only directory as an unprivileged user) and setpriv.
need=()
command -v cc >/dev/null || need+=(gcc)
command -v runuser >/dev/null || need+=(util-linux)
# The scale bench counts its nodes' traffic in a network namespace of its own (`unshare`,
# util-linux) whose loopback `ip` (iproute2) brings up.
command -v ip >/dev/null || need+=(iproute2)
# The postgres store's tests start a real server: Debian's `postgresql` (initdb, postgres
# in /usr/lib/postgresql/<version>/bin; run as user `postgres` through setpriv when root).
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || need+=(postgresql)
# etcd store tests start a real etcd; etcd-client's build needs protoc.
command -v etcd >/dev/null || need+=(etcd-server)
# etcdctl saves and restores snapshots (a cluster restored without bumping revisions).
command -v etcdctl >/dev/null || need+=(etcd-client)
command -v protoc >/dev/null || need+=(protobuf-compiler)
# ZooKeeper store tests run a standalone server from Debian's `zookeeper` package (its
# jars; it depends on a Java runtime).
{ [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null; } || need+=(zookeeper)
# The management endpoint's live page is checked in a real headless browser.
[ -x /usr/bin/chromium ] || need+=(chromium)
# The fault-injection suite moves one node's wall clock with libfaketime (`faketime`).
[ -f /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] || need+=(faketime)
install() {
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
  else
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
  fi
}
if [ ${#need[@]} -gt 0 ]; then
  step "install ${need[*]}" install
fi

step "format" cargo fmt --all --check
# The README's first command builds the default features with nothing but cargo and a C
# compiler: no protoc (etcd's client is behind the `etcd` feature). Checking runs every
# build script (protoc's user, the bundled SQLite's C compile) as building would.
step "default features without protoc" env PROTOC=/nonexistent/protoc cargo check -p tenure-cli --locked
# Every feature of the facade on its own, and none.
facade() {
  for features in "" sqlite postgres etcd zookeeper cluster singleton sharding management fault-injection; do
    cargo check -p tenure --no-default-features --features "$features" --locked
  done
}
step "facade features" facade
step "clippy" cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
# `rust-version` is true: the workspace builds with exactly that toolchain. When it is the
# default toolchain's version, clippy just checked every target and feature with it.
msrv=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
if rustc --version | grep -q "^rustc $msrv "; then
  echo "rust-version $msrv is this toolchain's: clippy checked the workspace with it"
else
  msrv_check() {
    command -v rustup >/dev/null || { echo "checking rust-version $msrv needs rustup" >&2; exit 1; }
    rustup toolchain list | grep -q "^$msrv-" || rustup toolchain install "$msrv" --profile minimal
    cargo "+$msrv" check --workspace --all-targets --all-features --locked
  }
  step "rust-version $msrv" msrv_check
fi
# Every publishable crate packages (files it needs lie inside it); the lease crate, which
# compiles the reference configuration in, is also built from its tarball.
package() {
  cargo package --workspace --no-verify --locked
  cargo package -p tenure-lease --locked
}
step "package" package
# One build of every test (and bench) target, which the runs below reuse.
step "build tests" cargo test --workspace --all-features --locked --no-run
# `--bench '*'`: the bench targets alone (`--benches` also takes every library's unit
# tests, which the test run below has run already).
step "build benches" cargo test --workspace --all-features --locked --bench '*' --no-run
# cargo-nextest (on the machines of this project's kind) runs each test in its own process,
# two at a time, the multi-process suites' clusters one at a time (.config/nextest.toml),
# and, as one test per bench binary, every bench's smoke run (below); without it, cargo test
# runs the same tests one binary at a time, then the benches' smoke runs.
# Benchmarks cannot rot: every bench binary runs once, small (criterion's test mode; the
# others read `tenure_lease_kit::bench::smoke`). A smoke run measures nothing, so it never
# writes docs/benchmarks.md: the benches' report mode is off under `cargo test`, the
# variable is unset besides, and the file is checked unchanged.
doc_before=$(sha256sum docs/benchmarks.md)
if cargo nextest --version >/dev/null 2>&1; then
  # The examples were built by "build tests" (the facade's examples test runs them).
  step "tests and bench smoke runs (nextest)" counted env -u TENURE_BENCH_REPORT \
    cargo nextest run --workspace --all-features --locked --no-fail-fast --lib --bins --tests --benches
  step "doc tests" counted cargo test --workspace --all-features --locked --doc
else
  step "tests (cargo test)" counted cargo test --workspace --all-features --locked --no-fail-fast
  step "bench smoke run" counted env -u TENURE_BENCH_REPORT cargo test --workspace --all-features --locked --bench '*'
fi
if [ "$(sha256sum docs/benchmarks.md)" != "$doc_before" ]; then
  echo "the bench smoke run changed docs/benchmarks.md" >&2
  exit 1
fi
