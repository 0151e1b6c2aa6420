//! `examples/singleton_ticks.rs` runs on a 3-node local cluster: the singleton counts under
//! its first token, moves to another node after the SIGKILL with a newer token, and keeps
//! counting.

use tenure_test_kit::example::run_example;

#[test]
fn the_singleton_example_fails_over_and_keeps_counting() {
    let text = run_example("singleton_ticks");
    let values: Vec<(u64, u64)> = text
        .lines()
        .filter_map(|l| {
            let value = l
                .split("counter = ")
                .nth(1)?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            let token = l.split("token ").nth(1)?.trim().parse().ok()?;
            Some((value, token))
        })
        .collect();
    assert!(
        values
            .windows(2)
            .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1),
        "monotonic: {text}"
    );
    let first = values.first().expect("counted");
    let last = values.last().expect("counted");
    assert!(
        last.1 > first.1 && last.0 > first.0,
        "failed over and kept counting: {text}"
    );
}
