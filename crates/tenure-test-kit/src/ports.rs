//! Loopback ports for the servers the kit starts (PostgreSQL, etcd, ZooKeeper, a node in
//! the test's process). A server binds its port itself, so the port cannot be held for it:
//! the kit chooses one that nothing can be handed by chance and starts the server again on
//! another when something took it all the same ([`taken`]).

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, UdpSocket};

/// How many ports a start tries before it fails: each retry follows a port taken between
/// choosing it and the server binding it, never a test failure.
pub(crate) const ATTEMPTS: usize = 10;

/// A loopback port free for TCP and UDP a moment ago, chosen at random below Linux's
/// ephemeral range (32768-60999 by default) and below the multi-process harness's node
/// ports (20000-32000): a port that `bind(:0)` or an outgoing connection of any process
/// hands out is never one of these, so only another test choosing the same one at the same
/// moment can take it before the server binds it. Panics when none is free in 1000 tries.
pub(crate) fn free() -> u16 {
    for _ in 0..1000 {
        let port = fastrand::u16(10_000..20_000);
        let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
        if TcpListener::bind(addr).is_ok() && UdpSocket::bind(addr).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in 10000-20000 after 1000 tries")
}

/// A server exited because its port was taken (see [`taken`]): start it on another one.
#[derive(Debug)]
pub(crate) struct PortTaken;

/// Whether a server's log says it could not bind its port ("Address already in use" from
/// PostgreSQL and Java, "address already in use" from Go).
pub(crate) fn taken(log: &str) -> bool {
    log.to_ascii_lowercase().contains("address already in use")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chosen_port_binds() {
        let port = free();
        assert!((10_000..20_000).contains(&port));
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("the chosen port binds");
    }

    #[test]
    fn each_servers_bind_failure_reads_as_taken() {
        for log in [
            "LOG:  could not bind IPv4 address \"127.0.0.1\": Address already in use",
            "listen tcp 127.0.0.1:12345: bind: address already in use",
            "java.net.BindException: Address already in use",
        ] {
            assert!(taken(log), "{log}");
        }
        assert!(!taken("database system is ready to accept connections"));
    }
}
