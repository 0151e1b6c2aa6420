//! The cluster port closes connections that never authenticate: a client that connects
//! and stays silent, and a client that completes the TLS handshake with a certificate of
//! the cluster's CA but never answers the cookie's challenge. A one-node cluster with
//! mutual TLS on an in-process store, `handshake-timeout` short.

use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use tokio::io::AsyncReadExt;
use tokio_rustls::rustls;

/// A CA and a certificate for 127.0.0.1 signed by it, written to `dir`; the certificate and
/// key are returned for the test's own client.
fn pki(dir: &std::path::Path) -> (String, String) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, &ca).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// Reads until the node closes the connection; fails the test if it stays open for a
/// minute (a bound on the wait, not a timing assertion: the timeout is 300 ms).
async fn closed_by_the_node(stream: &mut (impl AsyncReadExt + Unpin), what: &str) {
    let mut buf = [0u8; 256];
    let read = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .unwrap_or_else(|_| panic!("{what}: the node kept the connection open"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_authenticate_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = pki(dir.path());
    let dir_path = dir.path().display().to_string();
    let (node, _provider) = tenure_test_kit::node::start_node(
        |port| {
            let head = tenure_test_kit::node::memory_head("handshake-timeout");
            format!(
                r#"{head}[cluster]
port = {port}
cookie = "handshake-test-cookie-0123456789abcdef"
handshake-timeout = "300ms"
[cluster.tls]
enabled = true
cert = "{dir}/cert.pem"
key = "{dir}/key.pem"
ca = "{dir}/ca.pem"
"#,
                dir = dir_path
            )
        },
        |_| {},
    )
    .await;
    let port = node.addr().port;

    // Connects and sends nothing: no TLS handshake.
    let mut silent = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    closed_by_the_node(&mut silent, "a silent TCP connection").await;

    // Completes TLS with a certificate of the cluster's CA, then never authenticates.
    let mut roots = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    for c in rustls::pki_types::CertificateDer::pem_file_iter(dir.path().join("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let chain = rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .unwrap();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(client))
        .connect("127.0.0.1".try_into().unwrap(), tcp)
        .await
        .expect("the TLS handshake with the cluster's certificate succeeds");
    closed_by_the_node(&mut tls, "a TLS session that never authenticates").await;

    node.leave().await.unwrap();
}
