//! Durable entities' journals for `tenure check --journal`: every event of every persistence
//! id, read from a SQLite file or a PostgreSQL database.

use std::sync::Arc;
use std::time::Duration;

use tenure::history::Entry;
use tenure::history::check::{JournalCheck, JournalEvent, check_journal};
use tenure_journal::{Journal, JournalError, read_all};

/// Why a journal could not be read.
#[derive(Debug, thiserror::Error)]
pub enum JournalReadError {
    /// The journal could not be opened.
    #[error("cannot open journal {journal}: {source}")]
    Open {
        /// The journal as given (`--journal`; a URL's password is not shown).
        journal: String,
        /// Why (boxed: the store errors are large, and every `Result` carrying this error
        /// would pay for them).
        #[source]
        source: Box<OpenError>,
    },
    /// Its events could not be read.
    #[error("cannot read journal {journal}: {source}")]
    Read {
        /// The journal as given.
        journal: String,
        /// The journal's error.
        #[source]
        source: Box<JournalError>,
    },
}

/// Why a journal could not be opened (or, for a SQLite file, read).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The runtime that reads it could not be built.
    #[error("cannot start a runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// No SQLite file at the path given.
    #[error("no such file")]
    NoFile,
    /// SQLite refused to open or read the file.
    #[error("{0}")]
    Sqlite(#[from] tenure::sqlite::rusqlite::Error),
    /// The PostgreSQL URL or schema was refused as configuration.
    #[error("{0}")]
    Config(#[from] tenure::ConfigError),
    /// The PostgreSQL server could not be reached.
    #[error("{0}")]
    Connect(#[from] tenure::StoreError),
    /// The journal's tables could not be set up or read.
    #[error("{0}")]
    Journal(#[from] JournalError),
    /// This build has no PostgreSQL store.
    #[error("this build of tenure has no PostgreSQL (build it with the `postgres` feature)")]
    NoPostgres,
}

/// Events read per round trip.
const PAGE: usize = 1000;

/// How long opening a database and each read may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Every event of the journal `spec` names: a `postgres://` or `postgresql://` URL (its
/// tables in `schema`, beside the lease table `tenure_lease`), or else a SQLite file's path.
pub fn read_journal(spec: &str, schema: &str) -> Result<Vec<JournalEvent>, JournalReadError> {
    let shown = shown(spec);
    let open_error = |source: OpenError| JournalReadError::Open {
        journal: shown.clone(),
        source: Box::new(source),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| open_error(OpenError::Runtime(e)))?;
    runtime.block_on(async {
        if !is_url(spec) {
            return read_sqlite(std::path::Path::new(spec)).map_err(open_error);
        }
        let journal = open_postgres(spec, schema).await.map_err(open_error)?;
        let read = |source| JournalReadError::Read {
            journal: shown.clone(),
            source: Box::new(source),
        };
        let mut out = Vec::new();
        for pid in journal.persistence_ids().await.map_err(read)? {
            for e in read_all(journal.as_ref(), &pid, 1, PAGE)
                .await
                .map_err(read)?
            {
                out.push(JournalEvent {
                    persistence_id: pid.clone(),
                    seq: e.seq,
                    token: e.token.get(),
                    writer: e.writer,
                    payload: e.payload,
                });
            }
        }
        Ok(out)
    })
}

/// Every event of the SQLite journal at `path`, read on a read-only connection of its own
/// (a WAL reader: it waits for no writer, and a writer frozen in its transaction does not
/// stop it).
fn read_sqlite(path: &std::path::Path) -> Result<Vec<JournalEvent>, OpenError> {
    use tenure::sqlite::rusqlite::{Connection, OpenFlags};
    if !path.is_file() {
        return Err(OpenError::NoFile);
    }
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    conn.busy_timeout(TIMEOUT)?;
    let tables: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'tenure_journal'",
        [],
        |r| r.get(0),
    )?;
    if tables == 0 {
        return Ok(Vec::new());
    }
    let mut statement = conn.prepare(
        "SELECT persistence_id, seq, token, writer, payload FROM tenure_journal \
         ORDER BY persistence_id, seq",
    )?;
    let rows = statement.query_map([], |r| {
        Ok(JournalEvent {
            persistence_id: r.get(0)?,
            seq: r.get::<_, i64>(1)? as u64,
            token: r.get::<_, i64>(2)? as u64,
            writer: r.get(3)?,
            payload: r.get(4)?,
        })
    })?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

/// The journal check of `tenure check --journal` and `tenure demo`: reads the journal
/// `spec` (as [`read_journal`]) and checks it against `history` (sorted by `t`) with
/// [`check_journal`], replaying the demo's durable counter (`counter|<key>`, the one entity
/// whose state this build can replay) to compare recovered states. `Ok` holds the figures
/// and the violations (none: the journal passed); `Err` when the journal cannot be read.
pub fn check_counter_journal(
    history: &[Entry],
    spec: &str,
    schema: &str,
) -> Result<JournalCheck, JournalReadError> {
    let held = read_journal(spec, schema)?;
    let replay = |pid: &str, events: &[JournalEvent]| {
        pid.starts_with("counter|")
            .then(|| crate::demo::counter::replay_counter(events))
            .flatten()
    };
    Ok(check_journal(history, &held, Some(&replay)))
}

fn is_url(spec: &str) -> bool {
    spec.starts_with("postgres://") || spec.starts_with("postgresql://")
}

/// `spec` without a URL's password.
fn shown(spec: &str) -> String {
    if !is_url(spec) {
        return spec.to_string();
    }
    match (spec.find("://"), spec.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &spec[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &spec[..scheme + 3], &spec[at..]),
                None => spec.to_string(),
            }
        }
        _ => spec.to_string(),
    }
}

#[cfg(feature = "postgres")]
async fn open_postgres(url: &str, schema: &str) -> Result<Arc<dyn Journal>, OpenError> {
    let quote = |s: &str| toml::Value::String(s.to_string()).to_string();
    let text = format!(
        "[lease.journal]\nstore = \"postgres\"\nurl = {}\nschema = {}\n",
        quote(url),
        quote(schema)
    );
    let mut config = tenure::TenureConfig::reference();
    config.merge_str(&text, "--journal")?;
    let section = config.lease_section("journal")?;
    let mut options = tenure::postgres::PostgresOptions::from_section(&section)?;
    options.operation_timeout = TIMEOUT;
    let store = tenure::postgres::PostgresStore::connect(options).await?;
    let journal = tenure::postgres::PostgresJournal::open(&store).await?;
    Ok(Arc::new(journal))
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(_url: &str, _schema: &str) -> Result<Arc<dyn Journal>, OpenError> {
    Err(OpenError::NoPostgres)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_urls_password_is_not_shown() {
        assert_eq!(
            shown("postgres://me:secret@db:5432/x"),
            "postgres://me:***@db:5432/x"
        );
        assert_eq!(shown("postgres://me@db/x"), "postgres://me@db/x");
        assert_eq!(shown("/tmp/leases.sqlite"), "/tmp/leases.sqlite");
    }

    #[test]
    fn a_missing_or_foreign_sqlite_file_is_an_open_error_saying_which() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.sqlite");
        let err = read_journal(&missing.display().to_string(), "tenure").unwrap_err();
        assert!(
            matches!(&err, JournalReadError::Open { source, journal }
                if matches!(**source, OpenError::NoFile) && journal.ends_with("missing.sqlite")),
            "{err:?}"
        );
        assert!(
            err.to_string().ends_with("missing.sqlite: no such file"),
            "{err}"
        );
        let foreign = dir.path().join("notes.txt");
        std::fs::write(&foreign, "not a database, only some notes ".repeat(64)).unwrap();
        let err = read_journal(&foreign.display().to_string(), "tenure").unwrap_err();
        assert!(
            matches!(&err, JournalReadError::Open { source, .. } if matches!(**source, OpenError::Sqlite(_))),
            "{err:?}"
        );
        assert!(err.to_string().contains("not a database"), "{err}");
    }
}
