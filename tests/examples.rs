//! The `tenure` crate's own examples, run as a newcomer would run them.

use std::path::PathBuf;
use std::process::Command;

/// The built example `name` (cargo builds a package's examples with its tests).
fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe().expect("the test's own path");
    let debug = deps
        .parent()
        .and_then(|d| d.parent())
        .expect("the test sits in <target>/<profile>/deps");
    let path = debug.join("examples").join(name);
    assert!(
        path.exists(),
        "example {name} not built at {} (cargo test builds it)",
        path.display()
    );
    path
}

#[test]
fn the_cluster_example_moves_its_shards_and_singleton_when_the_first_node_leaves() {
    let output = Command::new(example("cluster"))
        .output()
        .expect("the cluster example runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the example failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let singleton_hosts: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("singleton announcer runs on "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    assert_eq!(singleton_hosts.len(), 2, "{stdout}");
    assert_ne!(singleton_hosts[0], singleton_hosts[1], "{stdout}");
    // Asked through its handle, the singleton answers from the second node.
    assert!(
        stdout.contains(&format!(
            "asked, the announcer says: singleton announcer runs on {} ",
            singleton_hosts[1]
        )),
        "{stdout}"
    );
    let (before, after) = stdout
        .split_once("only this node is left")
        .unwrap_or_else(|| panic!("the first node never left:\n{stdout}"));
    for person in ["alice", "bob", "carol", "dave"] {
        assert!(before.contains(&format!("hello {person} ")), "{stdout}");
        assert!(after.contains(&format!("hello {person} ")), "{stdout}");
    }
    // After the first node left, every greeting comes from the second one.
    assert!(
        after
            .lines()
            .filter(|l| l.starts_with("hello "))
            .all(|l| l.contains(&format!("from {}", singleton_hosts[1]))),
        "{stdout}"
    );
}

#[test]
fn the_durable_cart_outlives_the_node_that_filled_it() {
    let output = Command::new(example("durable_cart"))
        .output()
        .expect("the durable_cart example runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the example failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let line = |prefix: &str| {
        let rest = stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no line `{prefix}…`:\n{stdout}"));
        let (node, cart) = rest.split_once(": ").expect("node: cart");
        (node.to_string(), cart.to_string())
    };
    let (first, filled) = line("cart-42 filled on ");
    let (second, after) = line("cart-42 checked out on ");
    let items = r#"items: {"apple": 3, "pear": 1}"#;
    assert_eq!(filled, format!("Cart {{ {items}, checked_out: false }}"));
    assert_eq!(after, format!("Cart {{ {items}, checked_out: true }}"));
    assert_ne!(first, second, "another node served the cart");
}
