//! A TCP proxy between clients and a store server, for tests of network faults. It can
//! **cut** the traffic (bytes are held back in both directions while connections stay
//! open, and new connections wait: a network partition) and **delay the server's
//! answers** (requests reach the server and take effect at once; the bytes coming back are
//! held for the delay, so a caller whose operation timeout is shorter never sees them).
//! Each direction of a connection keeps its byte order.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::AnswerDelay;

#[derive(Debug, Default)]
struct State {
    cut: bool,
    delay: Option<Duration>,
    stopped: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    conns: Mutex<Vec<TcpStream>>,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks while cut; false once the proxy is stopped.
    fn pass(&self) -> bool {
        let mut state = self.state();
        while state.cut && !state.stopped {
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        !state.stopped
    }

    fn set(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state());
        self.changed.notify_all();
    }
}

/// A proxy listening on a loopback port; stops (closing every connection) when dropped.
#[derive(Debug)]
pub struct Proxy {
    /// The loopback port clients connect to.
    pub port: u16,
    shared: Arc<Shared>,
}

impl Proxy {
    /// Listens on a free loopback port, forwarding to `127.0.0.1:upstream`. Panics when no
    /// port can be bound (a test tool).
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if !s.pass() {
                    return;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) = (
                    client.try_clone(),
                    server.try_clone(),
                    client.try_clone(),
                    server.try_clone(),
                ) else {
                    continue;
                };
                s.conns
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend([c3, s3]);
                pump(client, s2, s.clone(), false);
                pump(server, c2, s.clone(), true);
            }
        });
        Proxy { port, shared }
    }

    /// Holds traffic back (`true`) or lets it flow again (`false`).
    pub fn set_cut(&self, cut: bool) {
        self.shared.set(|s| s.cut = cut);
    }

    /// From now on, the server's answers are held for `delay` (`None`: forwarded at once
    /// again; answers already held keep their delay, and their order).
    pub fn set_delay(&self, delay: Option<Duration>) {
        self.shared.set(|s| s.delay = delay);
    }
}

impl AnswerDelay for Proxy {
    fn set(&self, delay: Option<Duration>) {
        self.set_delay(delay);
    }
}

/// Forwards `from` to `to` (two threads: a reader stamping each chunk with the instant it
/// may go, a writer waiting for that instant and for the cut to end). `answers`: the
/// server-to-client direction, which the delay applies to.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: Arc<Shared>, answers: bool) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let s = shared.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let delay = if answers { s.state().delay } else { None };
            let at = Instant::now() + delay.unwrap_or_default();
            if tx.send((at, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        for (at, bytes) in rx {
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            if !shared.pass() || to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.set(|s| {
            s.stopped = true;
            s.cut = false;
        });
        for c in self
            .shared
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = c.shutdown(Shutdown::Both);
        }
        // Unblock the accept loop.
        let _ = TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], self.port)),
            Duration::from_millis(200),
        );
    }
}
