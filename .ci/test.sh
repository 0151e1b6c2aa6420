#!/usr/bin/env bash
# The test command of README.md: installs what the tests need, then checks formatting,
# lints and runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

# Tests need: cargo (with rustfmt and clippy), a C compiler for bundled SQLite, and
# util-linux's runuser (to check a read-only directory as an unprivileged user) and setpriv.
need=()
command -v cc >/dev/null || need+=(gcc)
command -v runuser >/dev/null || need+=(util-linux)
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
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
  else
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
  fi
fi

cargo fmt --all --check
# The README's first command builds the default features with nothing but cargo and a C
# compiler: no protoc (etcd's client is behind the `etcd` feature).
PROTOC=/nonexistent/protoc cargo build -p tenure-cli --locked
# Every feature of the facade on its own, and none.
for features in "" sqlite postgres etcd zookeeper cluster singleton sharding fault-injection; do
  cargo check -p tenure --no-default-features --features "$features" --locked
done
# `rust-version` is true: the workspace builds with exactly that toolchain (rustup fetches it
# when missing; with the same version as the default toolchain this reuses its build).
msrv=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
command -v rustup >/dev/null || { echo "checking rust-version $msrv needs rustup" >&2; exit 1; }
rustup toolchain list | grep -q "^$msrv-" || rustup toolchain install "$msrv" --profile minimal
cargo "+$msrv" check --workspace --all-targets --all-features --locked
# Every publishable crate packages (files it needs lie inside it); the lease crate, which
# compiles the reference configuration in, is also built from its tarball.
cargo package --workspace --no-verify --locked
cargo package -p tenure-lease --locked
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
cargo test --workspace --all-features --locked
# Benchmarks cannot rot: every bench binary runs once, small (criterion's test mode; the
# others read `tenure_lease::conformance::bench::smoke`).
cargo test --workspace --all-features --locked --bench '*'
