//! The node processes of the CLI's cluster examples (`sharded_counter`, `singleton_ticks`):
//! the example's own executable, started again in node mode on free loopback ports, each
//! with its config file and the path of the demo's fenced counter, stopped with SIGTERM.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use rustix::process::{Pid, Signal, kill_process};

/// The variable naming a node process's config file: set, the example runs as a node.
const NODE_CONFIG: &str = "TENURE_EXAMPLE_NODE";
/// The variable naming the fenced counter's file of a node process.
const NODE_COUNTER: &str = "TENURE_EXAMPLE_COUNTER";

/// In a node process started by [`spawn_node`]: its config file and the counter's file;
/// `None` in the example's own first process.
pub fn node_mode() -> Option<(PathBuf, PathBuf)> {
    let config = std::env::var_os(NODE_CONFIG)?;
    let counter = std::env::var_os(NODE_COUNTER)?;
    Some((config.into(), counter.into()))
}

/// `n` loopback ports free when asked (the nodes bind them soon after). `Err`: no socket
/// could be bound to find one.
pub fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    (0..n)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr().map(|a| a.port()))
        })
        .collect()
}

/// Writes `config` to `dir/node<i>.toml` and starts this executable on it in node mode,
/// counting into `dir/counter.sqlite`. `Err`: the file could not be written or the process
/// not started.
pub fn spawn_node(dir: &Path, i: usize, config: &str) -> std::io::Result<Child> {
    let path = dir.join(format!("node{i}.toml"));
    std::fs::write(&path, config)?;
    Command::new(std::env::current_exe()?)
        .env(NODE_CONFIG, &path)
        .env(NODE_COUNTER, dir.join("counter.sqlite"))
        .spawn()
}

/// Sends SIGTERM to every node process still running, so that each leaves gracefully, and
/// waits for it. `Err` names a node that did not leave cleanly, or what failed.
pub fn stop_nodes(children: &mut [Child]) -> Result<(), Box<dyn std::error::Error>> {
    for child in children {
        if child.try_wait()?.is_none() {
            kill_process(Pid::from_child(child), Signal::TERM)?;
            let status = child.wait()?;
            if !status.success() {
                return Err(format!("node {} did not leave cleanly: {status}", child.id()).into());
            }
        }
    }
    Ok(())
}
