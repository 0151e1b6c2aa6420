//! A TCP proxy between one node and its store, to cut that traffic: while cut, bytes are
//! held back in both directions (connections stay open, nothing answers, as in a network
//! partition) and new connections wait; healing lets them flow again.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

#[derive(Default)]
struct Gate {
    cut: Mutex<bool>,
    changed: Condvar,
    stopped: AtomicBool,
}

impl Gate {
    /// Blocks while cut; false once the proxy is stopped.
    fn pass(&self) -> bool {
        let mut cut = self.cut.lock().unwrap();
        while *cut && !self.stopped.load(Ordering::SeqCst) {
            cut = self.changed.wait(cut).unwrap();
        }
        !self.stopped.load(Ordering::SeqCst)
    }
}

pub struct Proxy {
    pub port: u16,
    gate: Arc<Gate>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    /// Listens on a free loopback port, forwarding to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let gate = Arc::new(Gate::default());
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (g, c) = (gate.clone(), conns.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if !g.pass() {
                    return;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                {
                    let mut all = c.lock().unwrap();
                    all.push(client.try_clone().unwrap());
                    all.push(server.try_clone().unwrap());
                }
                pump(
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    g.clone(),
                );
                pump(server, client, g.clone());
            }
        });
        Proxy { port, gate, conns }
    }

    /// Holds traffic back (`true`) or lets it flow (`false`).
    pub fn set_cut(&self, cut: bool) {
        *self.gate.cut.lock().unwrap() = cut;
        self.gate.changed.notify_all();
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, gate: Arc<Gate>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if !gate.pass() || to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.gate.stopped.store(true, Ordering::SeqCst);
        self.set_cut(false);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        // Unblock the accept loop.
        let _ = TcpStream::connect_timeout(
            &format!("127.0.0.1:{}", self.port).parse().unwrap(),
            Duration::from_millis(200),
        );
    }
}
