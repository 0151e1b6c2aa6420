//! A client's dial to an address where no node listens fails with a typed error naming the
//! address (port 1: below 1024, so no other test's node can take it).

use tenure_cluster::transport::DialError;
use tenure_cluster::{ClusterClient, ClusterError, ClusterSettings, NodeAddr};
use tenure_lease::TenureConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dial_to_no_node_is_a_connect_error_naming_the_address() {
    let config = TenureConfig::from_toml_str(
        "[tenure]\ndefault-lease-section = \"m\"\n[lease.m]\nstore = \"memory\"\n\
         [cluster]\nport = 1\ncookie = \"dial-test-cookie-0123456789abcdef0\"\n\
         dial-timeout = \"10s\"\n",
        "test",
    )
    .unwrap();
    let settings = ClusterSettings::from_config(&config).unwrap();
    let nobody = NodeAddr::parse("test", "127.0.0.1:1").unwrap();
    let Err(err) = ClusterClient::connect(&settings, &nobody).await else {
        panic!("a client connected to 127.0.0.1:1, where no node listens");
    };
    let ClusterError::Dial(DialError::Connect { peer, source }) = &err else {
        panic!("not a connect error: {err:?}");
    };
    assert_eq!(peer, "127.0.0.1:1");
    assert_eq!(
        source.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "{err}"
    );
    assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
}
