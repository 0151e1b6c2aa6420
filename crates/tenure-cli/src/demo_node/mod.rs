//! `tenure demo node`: one node of the demo's cluster. It runs what `tenure node` runs and
//! hosts the demo's examples besides: ticker singletons, the sharded counter, the increment
//! load through the node's region, and the slow-stop and blocked-thread fault injections of
//! the tests.

mod blocked_thread;
mod load;
mod slow_stop;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tenure::cluster::{ClusterSettings, Incarnation, Node};
use tenure::sharding::{Entity, EntityFactory, entity_factory};
use tenure::{LeaseProvider, TenureConfig};
use tenure_cli::demo::FencedCounter;
use tenure_cli::demo::counter::{Counter, DurableCounter};
use tenure_cli::demo::ticker::{CountRequest, Ticker, TickerArgs, TickerMsg};
use tenure_cli::history;
use tenure_journal::Journal;
use tenure_management::Management;
use tenure_singleton::spawner;

use crate::exit::{CliError, Outcome};
use blocked_thread::{BlockThreadSwitch, ThreadBlockingEntity};
use load::Load;
use slow_stop::{SlowStopSwitch, SlowStoppingActor, SlowStoppingEntity};

/// `tenure demo node` flags.
#[derive(clap::Args, Debug)]
pub struct DemoNodeArgs {
    /// Append the node's events (JSON Lines, host CLOCK_BOOTTIME) to this file.
    #[arg(long)]
    pub history: Option<PathBuf>,
    /// Host the example singleton NAME (repeatable): the oldest member runs it under the
    /// lease <system>-singleton-NAME; it adds one to a fenced counter every --tick.
    #[arg(long = "singleton", value_name = "NAME")]
    singletons: Vec<String>,
    /// The SQLite file of the fenced counters the example singletons write.
    #[arg(long, default_value = "/tmp/tenure-counter.sqlite")]
    counter: PathBuf,
    /// How often an example singleton ticks.
    #[arg(long, default_value = "100ms", value_parser = tenure::duration::parse)]
    tick: Duration,
    /// Host the example sharded counter (entity type `counter`, [sharding.counter]): one
    /// entity per key, each increment written to the --counter file with its shard's
    /// fencing token. With `remember-entities = true` in [sharding.counter], its entities
    /// start again wherever their shards go, with no message.
    #[arg(long)]
    sharded_counter: bool,
    /// Host the example sharded counter as a durable entity instead (entity type
    /// `counter`): one event per increment in a journal in the default lease section's
    /// store (the SQLite lease file, or beside the PostgreSQL lease table), every append
    /// fenced by the shard's grant, a snapshot every 50 events; a reply's value is the
    /// sequence number of its event. Check it with `tenure check --journal`.
    #[arg(long, conflicts_with = "sharded_counter")]
    durable_counter: bool,
    /// SQLite: keep the durable counter's journal in this file of its own, fenced by the
    /// lease file, rather than in the lease file (appends then write-lock the journal file
    /// only, so they never hold up the leases' renewals).
    #[arg(long, value_name = "FILE", requires = "durable_counter")]
    journal_file: Option<PathBuf>,
    /// Drive increments of keys key-0..key-(N-1) through this node's region, recording
    /// each request in the history when it ends: `ack` (acknowledged) or `no_ack` (with
    /// why), both with the instant it was `issued`. Closed loop by default (8 workers,
    /// each one increment at a time); open loop with --load-rate.
    #[arg(long, default_value_t = 0, value_name = "N")]
    load_keys: usize,
    /// Closed loop: pause between two increments of one load worker.
    #[arg(long, default_value = "20ms", value_parser = tenure::duration::parse)]
    load_interval: Duration,
    /// Open loop: ask every key this many times per second on a fixed schedule, whether
    /// or not earlier asks were answered.
    #[arg(long, value_name = "PER_SECOND", value_parser = parse_rate)]
    load_rate: Option<f64>,
    /// How long each increment waits for its answer before it counts as not
    /// acknowledged.
    #[arg(long, default_value = "5s", value_parser = tenure::duration::parse)]
    load_timeout: Duration,
    /// Host the example sharded daemon process `demo` with N workers (entity type
    /// `daemon-demo`, [sharding.daemon-demo]): each worker is alone in its shard, runs
    /// under its shard's lease, and is kept alive by keep-alives every second.
    #[arg(long, value_name = "N")]
    daemon: Option<usize>,
    /// Fault injection for tests (needs `cluster.fault-injection = true`): while FILE
    /// exists, the example entities and singletons take a minute to stop, so that only
    /// their supervisors' kills end them in time.
    #[arg(long, value_name = "FILE")]
    slow_stop_when: Option<PathBuf>,
    /// Fault injection for tests (needs `cluster.fault-injection = true`): while FILE
    /// holds `<entity id> <duration>`, the next message to that example counter entity
    /// blocks its thread (`std::thread::sleep`) for the duration, once across the cluster
    /// (the blocking entity creates FILE.blocked with its node and token).
    #[arg(long, value_name = "FILE")]
    block_thread_when: Option<PathBuf>,
}

/// A `--load-rate` that is no rate.
#[derive(Debug, thiserror::Error)]
enum RateError {
    /// Not a number.
    #[error(
        "`{text}` is not a rate: give requests per second per key, a number above 0 (e.g. 20 or 0.5)"
    )]
    NotANumber {
        text: String,
        #[source]
        source: std::num::ParseFloatError,
    },
    /// A number, but not a finite one above 0.
    #[error(
        "`{text}` is not a rate: give requests per second per key, a number above 0 (e.g. 20 or 0.5)"
    )]
    NotPositive { text: String },
}

/// `--load-rate`: a finite number of requests per second above zero (clap shows the
/// error's message).
fn parse_rate(text: &str) -> Result<f64, RateError> {
    match text.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        Ok(_) => Err(RateError::NotPositive {
            text: text.to_string(),
        }),
        Err(source) => Err(RateError::NotANumber {
            text: text.to_string(),
            source,
        }),
    }
}

/// What a demo node hosts besides membership.
struct Hosting<'a> {
    /// Names of ticker singletons to host (the example singleton).
    singletons: &'a [String],
    /// The fenced counter file the tickers write.
    counter: &'a Path,
    tick: Duration,
    /// Host the example sharded counter.
    sharded_counter: bool,
    /// Host it as a durable entity.
    durable_counter: bool,
    /// SQLite: the durable counter's own journal file.
    journal_file: Option<&'a Path>,
    /// The increment load driven through this node's region.
    load: Option<Load>,
    /// Fault injection: the example entities and singletons stop slowly while it is on.
    slow_stop: Option<SlowStopSwitch>,
    /// Fault injection: the example entity it names blocks its thread once.
    block_thread: Option<BlockThreadSwitch>,
    /// Workers of the example sharded daemon process.
    daemon: Option<usize>,
}

/// Runs a demo node as `tenure node` runs a node (until SIGTERM / Ctrl-C, then a graceful
/// leave), hosting what `args` asks for once it started.
pub async fn run(
    config: &TenureConfig,
    provider: &LeaseProvider,
    args: DemoNodeArgs,
    incarnation: Incarnation,
) -> Result<Outcome, CliError> {
    for (flag, given) in [
        ("--slow-stop-when", args.slow_stop_when.is_some()),
        ("--block-thread-when", args.block_thread_when.is_some()),
    ] {
        if given && !ClusterSettings::from_config(config)?.fault_injection {
            return Err(CliError::Command(format!(
                "{flag} is fault injection: it needs cluster.fault-injection = true"
            )));
        }
    }
    let shape = match args.load_rate {
        Some(rate) => load::Shape::Open { rate },
        None => load::Shape::Closed {
            pause: args.load_interval,
        },
    };
    let hosting = Hosting {
        singletons: &args.singletons,
        counter: &args.counter,
        tick: args.tick,
        sharded_counter: args.sharded_counter,
        durable_counter: args.durable_counter,
        journal_file: args.journal_file.as_deref(),
        load: (args.load_keys > 0).then_some(Load {
            keys: args.load_keys,
            shape,
            timeout: args.load_timeout,
        }),
        slow_stop: args.slow_stop_when.clone().map(SlowStopSwitch::new),
        block_thread: args.block_thread_when.clone().map(BlockThreadSwitch::new),
        daemon: args.daemon,
    };
    crate::node_cmd::node(config, provider, incarnation, async |node, management| {
        host(node, provider, management, hosting).await
    })
    .await
}

/// Starts the singletons, the sharded counter and the load `hosting` asks for on `node`.
async fn host(
    node: &Node,
    provider: &LeaseProvider,
    management: Option<&Management>,
    hosting: Hosting<'_>,
) -> Result<(), CliError> {
    if !hosting.singletons.is_empty() {
        let counter = FencedCounter::open(hosting.counter)?;
        for name in hosting.singletons {
            let (counter, name_owned, node_name, tick, slow) = (
                counter.clone(),
                name.clone(),
                node.addr().to_string(),
                hosting.tick,
                hosting.slow_stop.clone(),
            );
            let make_args = move |token| TickerArgs {
                name: name_owned.clone(),
                token,
                counter: counter.clone(),
                interval: tick,
                node: node_name.clone(),
            };
            let spawner = match slow {
                Some(switch) => spawner(move |token| {
                    let inner = Ticker;
                    let actor = SlowStoppingActor {
                        inner,
                        switch: switch.clone(),
                    };
                    (actor, make_args(token))
                }),
                None => spawner(move |token| (Ticker, make_args(token))),
            };
            tenure_singleton::start_on_node(node, provider, name, spawner)
                .await
                .map_err(|e| CliError::Command(e.to_string()))?;
            probe_through_proxy(node, provider, name).await?;
        }
    }
    if hosting.sharded_counter || hosting.durable_counter || hosting.load.is_some() {
        let (slow, block) = (hosting.slow_stop.clone(), hosting.block_thread.clone());
        let factory = if hosting.durable_counter {
            let journal = open_journal(provider, hosting.journal_file).await?;
            let entity = tenure::sharding::Durable::new(DurableCounter, journal);
            Some(with_faults(entity, slow, block))
        } else if hosting.sharded_counter {
            let counter = FencedCounter::open(hosting.counter)?;
            Some(with_faults(Counter { counter }, slow, block))
        } else {
            None
        };
        let region = tenure::sharding::start_on_node(node, provider, COUNTER_TYPE, factory)
            .await
            .map_err(|e| CliError::Command(e.to_string()))?;
        if let Some(m) = management {
            m.add_region(region.clone());
        }
        if let Some(load) = hosting.load {
            let start = usize::from(node.addr().port).wrapping_mul(7919);
            load::drive(node, region, start, load);
        }
    }
    if let Some(count) = hosting.daemon {
        let daemon = tenure::sharding::daemon::start_daemon(
            node,
            provider,
            DAEMON_NAME,
            count,
            IdleWorker,
            Duration::from_secs(1),
        )
        .await
        .map_err(|e| CliError::Command(e.to_string()))?;
        if let Some(m) = management {
            m.add_region(daemon.region().clone());
        }
        // Dropping the handle leaves the region and the keep-alives running: they end
        // with the node's process.
    }
    Ok(())
}

/// `entity` with the fault injections asked for: slow stops, a blocked thread.
fn with_faults<E: Entity>(
    entity: E,
    slow: Option<SlowStopSwitch>,
    block: Option<BlockThreadSwitch>,
) -> EntityFactory {
    match (slow, block) {
        (Some(slow), Some(block)) => entity_factory(ThreadBlockingEntity {
            inner: SlowStoppingEntity {
                inner: entity,
                switch: slow,
            },
            switch: block,
        }),
        (Some(slow), None) => entity_factory(SlowStoppingEntity {
            inner: entity,
            switch: slow,
        }),
        (None, Some(block)) => entity_factory(ThreadBlockingEntity {
            inner: entity,
            switch: block,
        }),
        (None, None) => entity_factory(entity),
    }
}

/// The journal of the durable counter, in the store of the default lease section: the
/// SQLite lease file (or `file`, fenced by it), or beside the PostgreSQL lease table (a
/// journal's appends are fenced by the leases of its own database).
async fn open_journal(
    provider: &LeaseProvider,
    file: Option<&Path>,
) -> Result<Arc<dyn Journal>, CliError> {
    let name = provider.config().default_lease_section()?;
    let section = provider.section_with_defaults(&name)?;
    match section.store.as_str() {
        "sqlite" => {
            let options: tenure::sqlite::SqliteOptions = section.options()?;
            let path = match options.path {
                Some(path) => path,
                None => tenure::sqlite::default_path()
                    .map_err(|e| CliError::Command(format!("lease.{name}.path: {e}")))?,
            };
            let journal = tenure::sqlite::SqliteJournal::open_beside(
                file.unwrap_or(&path),
                &path,
                section.settings.lease_operation_timeout,
            )?;
            Ok(Arc::new(journal))
        }
        #[cfg(feature = "postgres")]
        "postgres" if file.is_some() => Err(CliError::Command(format!(
            "--journal-file is for SQLite; lease.{name} is postgres, whose journal lives beside its lease table"
        ))),
        #[cfg(feature = "postgres")]
        "postgres" => {
            let options = tenure::postgres::PostgresOptions::from_section(&section)?;
            let store = tenure::postgres::PostgresStore::connect(options)
                .await
                .map_err(|e| CliError::Command(format!("lease.{name}: {e}")))?;
            let journal = tenure::postgres::PostgresJournal::open(&store)
                .await
                .map_err(|e| CliError::Command(e.to_string()))?;
            Ok(Arc::new(journal))
        }
        other => Err(CliError::Command(format!(
            "--durable-counter keeps its journal in the default lease section's store, which must be sqlite{}; lease.{name} is {other}",
            if cfg!(feature = "postgres") {
                " or postgres"
            } else {
                " (or postgres, in a build with the `postgres` feature)"
            }
        ))),
    }
}

/// The name of the example sharded daemon process (`--daemon`).
pub const DAEMON_NAME: &str = "demo";

/// The example daemon's worker: it only runs (its life is in the history, as
/// `entity_started` / `entity_stopped` of type `daemon-demo`).
struct IdleWorker;

impl tenure::sharding::daemon::DaemonWorker for IdleWorker {
    type State = ();

    async fn start(
        &self,
        index: usize,
        count: usize,
        ctx: &tenure::sharding::EntityContext,
    ) -> Result<(), ractor::ActorProcessingErr> {
        tracing::info!(worker = index, count, token = %ctx.token, "daemon worker started");
        Ok(())
    }
}

/// Four times a second, asks the singleton for its count through a proxy on this node and
/// records the answer (`proxy_reply`, with the node that answered) in the history: shows
/// `call` reaching the instance from every node, and when it reaches it again after a
/// fail-over, to within a quarter of a second (a probe that timed out is followed by the
/// next at once, not after a pause).
async fn probe_through_proxy(
    node: &Node,
    provider: &LeaseProvider,
    name: &str,
) -> Result<(), CliError> {
    let proxy = tenure_singleton::proxy_on_node::<TickerMsg>(node, provider, name)
        .await
        .map_err(|e| CliError::Command(e.to_string()))?;
    let name = name.to_string();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(250));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            match proxy
                .call(
                    |r| TickerMsg::Count(CountRequest {}, r),
                    Duration::from_secs(1),
                )
                .await
            {
                Ok(reply) => history::proxy_reply(&name, &reply.node, reply.token, reply.value),
                Err(e) => tracing::debug!(error = %e, "proxy probe"),
            }
        }
    });
    Ok(())
}

/// The entity type of the example sharded counter.
const COUNTER_TYPE: &str = "counter";

#[cfg(test)]
mod rate_tests {
    use super::*;

    #[test]
    fn a_load_rate_is_a_finite_number_above_zero() {
        assert_eq!(parse_rate("0.5").unwrap(), 0.5);
        for text in ["0", "-1", "inf", "NaN"] {
            let err = parse_rate(text).unwrap_err();
            assert!(
                matches!(&err, RateError::NotPositive { text: t } if t == text),
                "{text}: {err:?}"
            );
        }
        let err = parse_rate("fast").unwrap_err();
        assert!(matches!(err, RateError::NotANumber { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "`fast` is not a rate: give requests per second per key, a number above 0 (e.g. 20 or 0.5)"
        );
    }
}
