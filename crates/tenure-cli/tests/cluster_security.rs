//! Cluster security and bad input: TLS between nodes, and clear errors for bad settings.

use tenure_test_kit::cli;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cli::cluster::{Cluster, Options, TENURE, TestCluster, hold_ports};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// Writes a CA and a node certificate for 127.0.0.1 signed by it; returns the TOML table.
fn pki(dir: &Path, name: &str) -> String {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let node_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&node_key, &ca).unwrap();
    let path = |f: &str| -> PathBuf { dir.join(format!("{name}-{f}")) };
    std::fs::write(path("ca.pem"), ca.pem()).unwrap();
    std::fs::write(path("cert.pem"), cert.pem()).unwrap();
    std::fs::write(path("key.pem"), node_key.serialize_pem()).unwrap();
    format!(
        "[cluster.tls]\nenabled = true\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\n",
        path("cert.pem").display(),
        path("key.pem").display(),
        path("ca.pem").display()
    )
}

/// Starts nodes 0 and 1 and waits until each sees both up and reachable.
fn start_the_first_two(c: &mut Cluster) {
    c.spawn(0);
    c.spawn(1);
    c.wait_until("the TLS nodes converge", Duration::from_secs(20), |c| {
        (0..2).all(|i| {
            c.members(i)
                .is_some_and(|m| m.len() == 2 && m.iter().all(|m| m.status == "up" && m.reachable))
        })
    });
}

/// Two TLS nodes form a cluster; a plain-text node and a node of another CA, sharing the
/// same store and cookie, can neither connect nor become members.
#[test]
fn tls_nodes_refuse_plaintext_and_other_ca_peers() {
    let pki_dir = tempfile::tempdir().unwrap();
    let good = pki(pki_dir.path(), "good");
    let other = pki(pki_dir.path(), "other");
    let tls = Options {
        tail: good,
        ..Options::default()
    };
    let mut c = Cluster::with_options(2, &tls);
    let seed = c.nodes[0].addr.clone();
    let plain = c.add_node(&seed, &Options::default());
    let wrong_ca = c.add_node(
        &seed,
        &Options {
            tail: other,
            ..Options::default()
        },
    );
    start_the_first_two(&mut c);
    c.spawn(plain);
    c.spawn(wrong_ca);
    let outsiders = [c.nodes[plain].addr.clone(), c.nodes[wrong_ca].addr.clone()];
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        for i in 0..2 {
            let m = c.members(i).unwrap();
            assert!(
                m.iter().all(|m| !outsiders.contains(&m.addr)),
                "node {i} lists an outsider: {m:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    for i in [plain, wrong_ca] {
        let log = c.nodes[i].stderr();
        assert!(
            log.contains("session closed before authentication") || log.contains("TLS handshake"),
            "node {i} logs the refusal:\n{log}"
        );
    }
    c.wait_until(
        "the seed logs the refused handshakes",
        Duration::from_secs(10),
        |c| {
            c.nodes[0]
                .stderr()
                .contains("TLS handshake with an inbound connection failed")
        },
    );
}

fn run(config: &str, args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    let text = config.replace("{dir}", &dir.path().display().to_string());
    std::fs::write(&path, text).unwrap();
    let out = Command::new(&*TENURE)
        .arg("--config")
        .arg(&path)
        .args(args)
        .env_remove("TENURE_CONFIG")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const BASE: &str = "[lease.sqlite]\npath = \"{dir}/l.sqlite\"\n[cluster]\n";

#[test]
fn bad_node_settings_are_refused_naming_the_key_or_path() {
    // Held through the test: each config is refused before the node binds anything.
    let hold = hold_ports(1).pop().unwrap();
    let port = hold.port();
    let cases: Vec<(String, Vec<&str>)> = vec![
        (
            format!("{BASE}port = {port}\n"),
            vec!["cluster.cookie", "required"],
        ),
        (
            format!("{BASE}port = {port}\ncookie = \"secret\"\n"),
            vec!["cluster.cookie", "guess", "openssl rand -hex 16"],
        ),
        (
            format!("{BASE}port = {port}\ncookie = \"{COOKIE}\"\nseeds = [\"127.0.0.1\"]\n"),
            vec!["cluster.seeds[0]", "127.0.0.1", "host:port"],
        ),
        (
            format!("{BASE}port = {port}\ncookie = \"{COOKIE}\"\nseeds = [\"10.0.0.1:99999\"]\n"),
            vec!["cluster.seeds[0]", "99999"],
        ),
        (
            format!("{BASE}port = 0\ncookie = \"{COOKIE}\"\n"),
            vec!["cluster.port"],
        ),
        (
            format!("{BASE}port = {port}\ncookie = \"{COOKIE}\"\nhost = \"not a host\"\n"),
            vec!["cluster.host"],
        ),
        (
            format!(
                "{BASE}port = {port}\ncookie = \"{COOKIE}\"\n[cluster.tls]\nenabled = true\ncert = \"{{dir}}/missing.pem\"\nkey = \"{{dir}}/k.pem\"\nca = \"{{dir}}/ca.pem\"\n"
            ),
            vec!["cluster.tls.cert", "missing.pem"],
        ),
    ];
    for (config, wanted) in cases {
        let (code, err) = run(&config, &["node"]);
        assert_eq!(code, Some(2), "{config}\n{err}");
        for w in wanted {
            assert!(
                err.contains(w),
                "expected {w:?} in: {err}\nconfig:\n{config}"
            );
        }
    }
}

#[test]
fn a_port_in_use_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let (code, err) = run(
        &format!("{BASE}port = {port}\ncookie = \"{COOKIE}\"\n"),
        &["node"],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("127.0.0.1:{port}")) && err.contains("cannot listen"),
        "{err}"
    );
}

#[test]
fn a_udp_port_in_use_is_a_clear_error_too() {
    // The node takes its port for heartbeat datagrams as well: UDP held here, TCP let go.
    // Something else may take the TCP port before the node binds it (the node then names
    // TCP): another port is tried then.
    const ATTEMPTS: usize = 5;
    for attempt in 1..=ATTEMPTS {
        let mut hold = hold_ports(1).pop().unwrap();
        hold.release_tcp();
        let port = hold.port();
        let (code, err) = run(
            &format!("{BASE}port = {port}\ncookie = \"{COOKIE}\"\n"),
            &["node"],
        );
        assert_eq!(code, Some(2), "{err}");
        let named = err.contains(&format!("127.0.0.1:{port}")) && err.contains("cannot listen");
        if named && !err.contains("UDP") && attempt < ATTEMPTS {
            continue;
        }
        assert!(named && err.contains("UDP"), "{err}");
        return;
    }
}

/// Unreachable seeds at start: the node keeps running and retrying, says so, and still
/// leaves cleanly.
#[test]
fn unreachable_seeds_are_retried_not_fatal() {
    let mut c = Cluster::new(1);
    // Held through the test, not listening: dials to it are refused.
    let dead = hold_ports(1).pop().unwrap();
    let text = std::fs::read_to_string(&c.nodes[0].config)
        .unwrap()
        .replace(
            &format!("seeds = [\"{}\"]", c.nodes[0].addr),
            &format!("seeds = [\"{}\"]", dead.addr()),
        );
    std::fs::write(&c.nodes[0].config, text).unwrap();
    c.spawn(0);
    c.wait_until("the node is up on its own", Duration::from_secs(10), |c| {
        c.members(0)
            .is_some_and(|m| m.len() == 1 && m[0].status == "up")
    });
    c.wait_until(
        "the node logs the unreachable seed",
        Duration::from_secs(10),
        |c| c.nodes[0].stderr().contains("cannot reach node; retrying"),
    );
    assert!(c.stop(0).success());
}

/// The cookie of the harness's nodes.
const COOKIE: &str = "harness-cookie-0123456789abcdef0123";

/// A heartbeat as it travels in a datagram (the fields of `tenure_cluster`'s, spelled out:
/// this is what someone outside the cluster can write).
#[derive(serde::Serialize)]
struct ForgedHeartbeat {
    node: String,
    incarnation: u64,
    seq: u64,
    age: u64,
    reach: Vec<ForgedRow>,
    digest: u64,
    want_table: bool,
    hears_you: bool,
    your_datagrams_arrive: bool,
}

#[derive(serde::Serialize)]
struct ForgedRow {
    observer: String,
    incarnation: u64,
    version: u64,
    unreachable: Vec<String>,
}

/// `hb` sealed as a datagram with a MAC keyed by the cookie and the system alone.
fn sealed_with_the_cookie(hb: &ForgedHeartbeat, cookie: &str, system: &str) -> Vec<u8> {
    use hmac::{KeyInit, Mac};
    let config = bincode::config::standard();
    let body = bincode::serde::encode_to_vec(hb, config).unwrap();
    let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(cookie.as_bytes()).unwrap();
    mac.update(b"tenure heartbeat datagram v1\0");
    mac.update(&(system.len() as u64).to_le_bytes());
    mac.update(system.as_bytes());
    mac.update(&body);
    let tag = mac.finalize().into_bytes().to_vec();
    bincode::serde::encode_to_vec((&body, &tag), config).unwrap()
}

/// How long node `viewer` has not heard `addr`, in its view.
fn silence_ms(c: &Cluster, viewer: usize, addr: &str) -> Option<u64> {
    let view = c.view(viewer)?;
    view["members"]
        .as_array()?
        .iter()
        .find(|m| m["addr"] == addr)?["silence_ms"]
        .as_u64()
}

/// With mutual TLS, someone who knows the cookie but holds no certificate sends node 1
/// heartbeat datagrams in node 0's name with the largest sequence number and a
/// reachability row of node 0 with the largest version: node 1 drops them, and goes on
/// hearing node 0's own heartbeats.
#[test]
fn the_cookie_alone_forges_no_heartbeat_that_wedges_a_node() {
    let pki_dir = tempfile::tempdir().unwrap();
    let tls = Options {
        tail: pki(pki_dir.path(), "good"),
        ..Options::default()
    };
    let mut c = Cluster::with_options(2, &tls);
    start_the_first_two(&mut c);
    let victim = c.nodes[0].addr.clone();
    let incarnation = c
        .members(1)
        .unwrap()
        .into_iter()
        .find(|m| m.addr == victim)
        .unwrap()
        .incarnation;
    let forged = ForgedHeartbeat {
        node: victim.clone(),
        incarnation,
        seq: u64::MAX - 1,
        age: 1,
        reach: vec![ForgedRow {
            observer: victim.clone(),
            incarnation,
            version: u64::MAX - 1,
            unreachable: Vec::new(),
        }],
        digest: 0,
        want_table: true,
        hears_you: true,
        your_datagrams_arrive: true,
    };
    let datagram = sealed_with_the_cookie(&forged, COOKIE, "tenure");
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let sent = Instant::now();
    for _ in 0..3 {
        socket.send_to(&datagram, &c.nodes[1].addr).unwrap();
    }
    // A node that took the forged sequence number drops every later heartbeat of node 0:
    // node 0 turns unreachable there after unreachable-after (1.5 s), and stays so but for
    // the moments after each stale session is closed and redialled (every 4.5 s). Watch
    // node 1 for three times that.
    while sent.elapsed() < Duration::from_millis(3 * 4500) {
        let m = c.members(1).unwrap();
        assert!(
            m.iter().all(|m| m.status == "up" && m.reachable),
            "node 1 stopped hearing node 0 after the forged datagrams: {m:?}"
        );
        assert!(
            silence_ms(&c, 1, &victim).is_some_and(|s| s < 1500),
            "node 1 has not heard node 0 for unreachable-after"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let unreachable: Vec<_> = c
        .history()
        .into_iter()
        .filter(|e| e["node"] == c.nodes[1].addr.as_str() && e["event"] == "unreachable")
        .collect();
    assert!(
        unreachable.is_empty(),
        "node 1 saw node 0 unreachable: {unreachable:?}"
    );
}

/// A client that connects to a plain-text node's cluster port and never authenticates is
/// closed after `handshake-timeout`; the node logs it and stays a member.
#[test]
fn a_connection_that_never_authenticates_is_closed() {
    use std::io::Read;
    let mut c = Cluster::with_options(
        1,
        &Options {
            cluster_extra: "handshake-timeout = \"300ms\"".into(),
            ..Options::default()
        },
    );
    c.spawn(0);
    c.wait_until("the node is up", Duration::from_secs(20), |c| {
        c.members(0)
            .is_some_and(|m| m.len() == 1 && m[0].status == "up")
    });
    let mut silent = std::net::TcpStream::connect(&c.nodes[0].addr).unwrap();
    // A bound on the wait (the timeout is 300 ms), not a timing assertion.
    silent
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut buf = [0u8; 64];
    loop {
        match silent.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the node kept a silent connection open: {e}"),
        }
    }
    c.wait_until("the node logs why", Duration::from_secs(10), |c| {
        c.nodes[0]
            .stderr()
            .contains("did not authenticate within cluster.handshake-timeout")
    });
    assert_eq!(c.members(0).unwrap()[0].status, "up");
}

/// A port taken by something else between the harness letting it go and the node binding
/// it: the node's first start moves to another held port, and the seeds follow.
#[test]
fn a_first_start_whose_port_was_taken_moves_to_another() {
    let mut c = Cluster::new(2);
    let taken = c.nodes[0].port;
    c.nodes[0].release_port();
    let _thief = (
        std::net::TcpListener::bind(("127.0.0.1", taken)).unwrap(),
        std::net::UdpSocket::bind(("127.0.0.1", taken)).unwrap(),
    );
    c.start_all();
    assert_ne!(c.nodes[0].port, taken);
    c.wait_converged(Duration::from_secs(30));
}
