//! Benches writing their own section of `docs/benchmarks.md` (the report mode).
//!
//! A bench builds one [`Report`]: its name, the command that runs it, and a table. Every
//! run prints the table; with `TENURE_BENCH_REPORT=1` in the environment of a real run
//! (`cargo bench`, not the test command's smoke run) [`Report::finish`] also rewrites the
//! bench's section of `docs/benchmarks.md`, the lines between `<!-- bench:<name> begin -->`
//! and `<!-- bench:<name> end -->`, stamped with the exact command, the machine, the date
//! (UTC) and the commit. A section not in the file yet is added at its end; everything
//! outside the section, hand-written prose included, stays byte for byte as it was.
//!
//! An environment variable rather than a `--report` argument: criterion's benches parse
//! their arguments and refuse ones they do not know, and cargo passes arguments after `--`
//! to every bench target a command selects.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use crate::bench::smoke;

/// The environment variable that turns the report mode on when set to `1`.
pub const REPORT_VAR: &str = "TENURE_BENCH_REPORT";

/// Prefixes of the environment variables that change what a bench measures; those set are
/// written into the stamped command so that it reproduces the run.
const KNOB_PREFIXES: [&str; 2] = ["TENURE_BENCH_", "TENURE_SIM_"];

/// What went wrong writing a bench's section.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The file's markers for this bench do not delimit exactly one section; nothing was
    /// written.
    #[error("{}: bench `{bench}`: {problem}; nothing written", file.display())]
    Malformed {
        /// The file holding the sections.
        file: PathBuf,
        /// The bench whose section could not be found.
        bench: String,
        /// What is wrong with the markers, with line numbers.
        problem: String,
    },
    /// A bench name that cannot appear in a marker.
    #[error("bench name `{0}`: a section's name is letters, digits, `_` and `-`")]
    BadName(String),
    /// Reading, writing or renaming the file failed.
    #[error("{}: {source}", file.display())]
    Io {
        /// The file read or written (or the temporary file beside it).
        file: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// True when this run should write its section: [`REPORT_VAR`] is `1` and the bench runs
/// for real. A smoke run (`cargo test --benches`, the test command) never writes, whatever
/// the environment says: its figures measure nothing.
pub fn report_mode() -> bool {
    report_mode_of(smoke(), std::env::var(REPORT_VAR).ok().as_deref())
}

fn report_mode_of(smoke: bool, var: Option<&str>) -> bool {
    !smoke && var == Some("1")
}

/// `docs/benchmarks.md` of this workspace.
pub fn doc_path() -> PathBuf {
    workspace_root().join("docs").join("benchmarks.md")
}

fn workspace_root() -> PathBuf {
    // This crate lives at crates/tenure-lease-kit of the workspace.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// One bench's result table and how it was produced.
#[derive(Clone, Debug)]
pub struct Report {
    bench: String,
    command: String,
    columns: Vec<String>,
    rows: Vec<Vec<String>>,
    notes: Vec<String>,
    load_at_start: Option<f64>,
    internal: Vec<String>,
}

impl Report {
    /// A report for the bench `bench` (its section's name, usually the bench target's
    /// name), run by `command` (`cargo bench -p <crate> --bench <name>`, with its features;
    /// the stamp adds `--profile dev` in a debug build and the bench knobs set in the
    /// environment), with a table of these `columns`. Create it when the bench starts: it
    /// notes the machine's load average then.
    pub fn new(bench: &str, command: &str, columns: &[&str]) -> Report {
        Report {
            bench: bench.to_string(),
            command: command.to_string(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
            load_at_start: load_average(),
            internal: Vec::new(),
        }
    }

    /// Names an environment variable the bench sets for a process of its own (a child, a
    /// re-run of itself), so that the stamped command leaves it out like any variable that
    /// is not a knob of the bench.
    pub fn internal_var(&mut self, var: &str) {
        self.internal.push(var.to_string());
    }

    /// Adds a row. Bench-only: panics when the row's cell count is not the column count,
    /// as a broken bench should.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let row: Vec<String> = cells.into_iter().map(Into::into).collect();
        assert_eq!(
            row.len(),
            self.columns.len(),
            "bench `{}`: a row of {} cells for {} columns: {row:?}",
            self.bench,
            row.len(),
            self.columns.len()
        );
        self.rows.push(row);
    }

    /// Adds a line printed under the table (what a figure means, a goal, a seed).
    pub fn note(&mut self, text: impl Into<String>) {
        self.notes.push(text.into());
    }

    /// The table in Markdown, then the notes.
    pub fn table(&self) -> String {
        let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
        let mut out = String::new();
        let line = |cells: &[String]| {
            let cells: Vec<String> = cells.iter().map(|c| cell(c)).collect();
            format!("| {} |\n", cells.join(" | "))
        };
        out.push_str(&line(&self.columns));
        out.push_str(&format!("|{}\n", "---|".repeat(self.columns.len())));
        for row in &self.rows {
            out.push_str(&line(row));
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for note in &self.notes {
                out.push_str(note);
                out.push('\n');
            }
        }
        out
    }

    /// The section this report writes: its markers, the stamp and the table.
    pub fn section(&self, stamp: &Stamp) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{}", begin_marker(&self.bench));
        let _ = writeln!(
            out,
            "<!-- Written by the bench in report mode ({REPORT_VAR}=1): edit the bench, not this section. -->"
        );
        let _ = writeln!(
            out,
            "Command: `{}`. Machine: {}. Date: {}. Commit: {}.",
            stamp.command, stamp.machine, stamp.date, stamp.commit
        );
        out.push('\n');
        out.push_str(&self.table());
        let _ = writeln!(out, "{}", end_marker(&self.bench));
        out
    }

    /// The stamp of a run finishing now: the command with the knobs set, this machine, the
    /// time and the commit of the workspace.
    pub fn stamp(&self) -> Stamp {
        Stamp {
            command: full_command(
                &self.command,
                std::env::vars().filter(|(k, _)| !self.internal.contains(k)),
            ),
            machine: machine(self.load_at_start, load_average()),
            date: utc_now(),
            commit: commit(&workspace_root()),
        }
    }

    /// Prints the table; in [`report_mode`], also writes the bench's section of
    /// [`doc_path`]. Ok(Some(path)) when the section was written there, Ok(None) when the
    /// report mode is off (nothing written); Err when the file could not be read or written
    /// or its markers for this bench are malformed (the file is then left as it was).
    pub fn finish(&self) -> Result<Option<PathBuf>, ReportError> {
        println!("\n{}", self.table());
        if !report_mode() {
            if smoke() && std::env::var(REPORT_VAR).is_ok_and(|v| v == "1") {
                println!("({REPORT_VAR}=1 ignored: a smoke run measures nothing to report)");
            }
            return Ok(None);
        }
        let file = doc_path();
        write_section(&file, &self.bench, &self.section(&self.stamp()))?;
        println!("({} section `{}` written)", file.display(), self.bench);
        Ok(Some(file))
    }
}

/// How a report's figures were produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The command that reproduces the run.
    pub command: String,
    /// The CPU, core count, memory, kernel and load average.
    pub machine: String,
    /// When the run finished, UTC.
    pub date: String,
    /// The workspace's commit, `+dirty` when tracked files differ from it.
    pub commit: String,
}

fn begin_marker(bench: &str) -> String {
    format!("<!-- bench:{bench} begin -->")
}

fn end_marker(bench: &str) -> String {
    format!("<!-- bench:{bench} end -->")
}

fn valid_name(bench: &str) -> bool {
    !bench.is_empty()
        && bench
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `doc` with the section of `bench` replaced by `section` (which carries its own
/// markers), or `section` added at the end when `doc` has no markers for `bench`. Every
/// byte outside the replaced lines is kept. `file` only names the file in errors.
///
/// # Errors
/// [`ReportError::Malformed`] when `doc`'s markers for `bench` are not one begin line
/// followed by one end line with no other bench's marker between them (or a line starts
/// like one of this bench's markers but is neither); [`ReportError::BadName`] for a name
/// that cannot be a marker's.
pub fn rewrite(doc: &str, bench: &str, section: &str, file: &Path) -> Result<String, ReportError> {
    if !valid_name(bench) {
        return Err(ReportError::BadName(bench.to_string()));
    }
    let malformed = |problem: String| ReportError::Malformed {
        file: file.to_path_buf(),
        bench: bench.to_string(),
        problem,
    };
    let (begin, end) = (begin_marker(bench), end_marker(bench));
    let ours = format!("<!-- bench:{bench} ");
    // (line number, byte offset of the line, offset after its newline)
    let (mut begins, mut ends, mut others) = (Vec::new(), Vec::new(), Vec::new());
    let mut offset = 0;
    for (i, line) in doc.split_inclusive('\n').enumerate() {
        let (start, after) = (offset, offset + line.len());
        offset = after;
        let text = line.trim_end_matches(['\n', '\r']).trim_end();
        if text == begin {
            begins.push((i + 1, start, after));
        } else if text == end {
            ends.push((i + 1, start, after));
        } else if text.starts_with(&ours) {
            return Err(malformed(format!(
                "line {} is neither `{begin}` nor `{end}`",
                i + 1
            )));
        } else if text.starts_with("<!-- bench:") {
            others.push(i + 1);
        }
    }
    let lines = |v: &[(usize, usize, usize)]| {
        v.iter()
            .map(|l| l.0.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let count = |v: &[(usize, usize, usize)], kind: &str| match v.len() {
        1 => format!("1 {kind} marker (line {})", lines(v)),
        n => format!("{n} {kind} markers (lines {})", lines(v)),
    };
    match (begins.as_slice(), ends.as_slice()) {
        ([], []) => {
            let mut out = doc.to_string();
            if !out.is_empty() {
                if !out.ends_with('\n') {
                    out.push('\n');
                }
                out.push('\n');
            }
            out.push_str(section);
            Ok(out)
        }
        ([(b, b_start, _)], [(e, _, e_after)]) if b < e => {
            if let Some(other) = others.iter().find(|&&o| o > *b && o < *e) {
                return Err(malformed(format!(
                    "another bench's marker at line {other} lies inside its section (lines {b} to {e})"
                )));
            }
            let rest = &doc[*e_after..];
            let mut section = section;
            if !doc[..*e_after].ends_with('\n') {
                // The end marker was the file's last line, without a newline: keep it so.
                section = section.strip_suffix('\n').unwrap_or(section);
            }
            Ok(format!("{}{section}{rest}", &doc[..*b_start]))
        }
        ([(b, ..)], [(e, ..)]) => Err(malformed(format!(
            "its end marker (line {e}) comes before its begin marker (line {b})"
        ))),
        (b, []) => Err(malformed(format!(
            "{} without an end marker `{end}`",
            count(b, "begin")
        ))),
        ([], e) => Err(malformed(format!(
            "{} without a begin marker `{begin}`",
            count(e, "end")
        ))),
        (b, e) => Err(malformed(format!(
            "{} and {}: a section appears once",
            count(b, "begin"),
            count(e, "end")
        ))),
    }
}

/// Rewrites the section of `bench` in `file` (see [`rewrite`]) atomically: the new text
/// goes to a temporary file beside it, flushed, then renamed over it, so a reader sees the
/// old file or the new one, never a part.
///
/// # Errors
/// As [`rewrite`], or [`ReportError::Io`] when `file` cannot be read or the new text cannot
/// be written and renamed into place; `file` is unchanged then.
pub fn write_section(file: &Path, bench: &str, section: &str) -> Result<(), ReportError> {
    let io = |file: &Path| {
        let file = file.to_path_buf();
        move |source| ReportError::Io { file, source }
    };
    let doc = std::fs::read_to_string(file).map_err(io(file))?;
    let new = rewrite(&doc, bench, section, file)?;
    let dir = file.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io(dir))?;
    tmp.write_all(new.as_bytes()).map_err(io(tmp.path()))?;
    tmp.as_file().sync_all().map_err(io(tmp.path()))?;
    if let Ok(meta) = std::fs::metadata(file) {
        // Keep the file's permissions, not the temporary file's 0600.
        let _ = std::fs::set_permissions(tmp.path(), meta.permissions());
    }
    tmp.persist(file).map_err(|e| ReportError::Io {
        file: file.to_path_buf(),
        source: e.error,
    })?;
    Ok(())
}

/// `command` as it reproduces this run: the report variable and the bench knobs set in
/// `env` first, and `--profile dev` when this is a debug build.
fn full_command(command: &str, env: impl IntoIterator<Item = (String, String)>) -> String {
    let mut knobs: Vec<String> = env
        .into_iter()
        .filter(|(k, _)| k != REPORT_VAR && KNOB_PREFIXES.iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    knobs.sort();
    let mut command = command.to_string();
    if cfg!(debug_assertions) && !command.contains("--profile") {
        command = command.replacen("cargo bench", "cargo bench --profile dev", 1);
    }
    let mut parts = vec![format!("{REPORT_VAR}=1")];
    parts.extend(knobs);
    parts.push(command);
    parts.join(" ")
}

/// The 1-minute load average, from /proc/loadavg.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// "<CPU model>, <n> cores, <memory> GiB, <kernel> <arch>, load average <start> to <end>",
/// each part that can be read.
fn machine(load_start: Option<f64>, load_end: Option<f64>) -> String {
    let mut parts = Vec::new();
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    if let Some(model) = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
    {
        parts.push(model.1.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    if let Ok(n) = std::thread::available_parallelism() {
        parts.push(format!("{n} cores"));
    }
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    if let Some(kib) = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
    {
        parts.push(format!("{:.0} GiB", kib / (1024.0 * 1024.0)));
    }
    if let Some(uname) = run("uname", &["-sr"], None) {
        parts.push(format!("{uname} {}", std::env::consts::ARCH));
    }
    match (load_start, load_end) {
        (Some(s), Some(e)) => parts.push(format!(
            "load average {s:.1} at the start, {e:.1} at the end"
        )),
        (_, Some(e)) => parts.push(format!("load average {e:.1} at the end")),
        _ => {}
    }
    if parts.is_empty() {
        "unknown".to_string()
    } else {
        parts.join(", ")
    }
}

/// Now, as `YYYY-MM-DD HH:MM UTC`.
fn utc_now() -> String {
    let t = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    // 2026-11-29T06:05:25Z
    format!("{} {} UTC", &t[..10], &t[11..16])
}

/// The short commit of `root`'s HEAD, `+dirty` when a tracked file differs from it (the
/// report file itself aside: the benches write it); "unknown" without git.
fn commit(root: &Path) -> String {
    let Some(head) = run("git", &["rev-parse", "--short", "HEAD"], Some(root)) else {
        return "unknown".to_string();
    };
    let status = run(
        "git",
        &[
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ".",
            ":(exclude)docs/benchmarks.md",
        ],
        Some(root),
    );
    match status {
        Some(s) if s.is_empty() => head,
        _ => format!("{head}+dirty"),
    }
}

/// The trimmed standard output of a successful `program args`, else None.
fn run(program: &str, args: &[&str], dir: Option<&Path>) -> Option<String> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "docs/benchmarks.md";

    fn section(bench: &str, body: &str) -> String {
        format!("{}\n{body}\n{}\n", begin_marker(bench), end_marker(bench))
    }

    fn doc() -> String {
        [
            "# Benchmarks\n\nProse before, kept as written.  \n\n",
            &section("alpha", "| a |\n|---|\n| 1 |"),
            "\nHand-written text between the sections\r\nwith a CRLF line.\n\n",
            &section("beta", "| b |\n|---|\n| 2 |"),
            "\nTrailing prose without a final newline",
        ]
        .concat()
    }

    #[test]
    fn replaces_one_section_and_keeps_every_other_byte() {
        let doc = doc();
        let new = section("alpha", "| a |\n|---|\n| 3 |\n| 4 |");
        let out = rewrite(&doc, "alpha", &new, Path::new(FILE)).unwrap();
        let old = section("alpha", "| a |\n|---|\n| 1 |");
        let at = doc.find(&old).unwrap();
        assert_eq!(&out[..at], &doc[..at]);
        assert_eq!(&out[at..at + new.len()], new);
        assert_eq!(&out[at + new.len()..], &doc[at + old.len()..]);
        // Rewriting with the same text is the identity.
        assert_eq!(rewrite(&out, "alpha", &new, Path::new(FILE)).unwrap(), out);
    }

    #[test]
    fn replaces_the_last_section_of_a_file_without_a_final_newline() {
        let doc = format!("intro\n\n{}", section("gamma", "old").trim_end());
        let new = section("gamma", "new");
        let out = rewrite(&doc, "gamma", &new, Path::new(FILE)).unwrap();
        assert_eq!(out, format!("intro\n\n{}", new.trim_end()));
    }

    #[test]
    fn adds_a_missing_section_at_the_end() {
        let doc = doc();
        let new = section("delta", "| d |\n|---|\n| 5 |");
        let out = rewrite(&doc, "delta", &new, Path::new(FILE)).unwrap();
        assert_eq!(out, format!("{doc}\n\n{new}"));
        let out = rewrite("x\n", "delta", &new, Path::new(FILE)).unwrap();
        assert_eq!(out, format!("x\n\n{new}"));
        assert_eq!(rewrite("", "delta", &new, Path::new(FILE)).unwrap(), new);
    }

    #[test]
    fn a_name_that_prefixes_another_is_a_different_section() {
        let doc = doc();
        let new = section("alp", "x");
        let out = rewrite(&doc, "alp", &new, Path::new(FILE)).unwrap();
        assert_eq!(out, format!("{doc}\n\n{new}"));
    }

    fn malformed(doc: &str, bench: &str) -> String {
        let err = rewrite(doc, bench, &section(bench, "new"), Path::new(FILE)).unwrap_err();
        assert!(matches!(err, ReportError::Malformed { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("{FILE}: bench `{bench}`: ")),
            "{msg}"
        );
        msg
    }

    #[test]
    fn malformed_markers_are_refused_naming_the_file_and_the_bench() {
        let begin = begin_marker("alpha");
        let end = end_marker("alpha");
        let msg = malformed(&format!("a\n{begin}\nb\n"), "alpha");
        assert!(
            msg.contains("1 begin marker (line 2) without an end marker"),
            "{msg}"
        );
        let msg = malformed(&format!("{end}\nb\n"), "alpha");
        assert!(msg.contains("without a begin marker"), "{msg}");
        let msg = malformed(&format!("{end}\nb\n{begin}\n"), "alpha");
        assert!(
            msg.contains("(line 1) comes before its begin marker (line 3)"),
            "{msg}"
        );
        let msg = malformed(
            &format!("{}\n{}", doc(), section("alpha", "again")),
            "alpha",
        );
        assert!(
            msg.contains("2 begin markers (lines 5, 21) and 2 end markers (lines 9, 23)"),
            "{msg}"
        );
        let msg = malformed("<!-- bench:alpha begin-->\n", "alpha");
        assert!(msg.contains("line 1 is neither"), "{msg}");
        let nested = format!("{begin}\n{}{end}\n", section("beta", "b"));
        let msg = malformed(&nested, "alpha");
        assert!(msg.contains("another bench's marker at line 2"), "{msg}");
        assert!(matches!(
            rewrite("", "a b", "", Path::new(FILE)),
            Err(ReportError::BadName(_))
        ));
    }

    #[test]
    fn write_section_replaces_the_file_and_leaves_it_alone_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("benchmarks.md");
        std::fs::write(&file, doc()).unwrap();
        let new = section("beta", "| b |\n|---|\n| 9 |");
        write_section(&file, "beta", &new).unwrap();
        let written = std::fs::read_to_string(&file).unwrap();
        assert_eq!(written, rewrite(&doc(), "beta", &new, &file).unwrap());
        let broken = format!("{written}\n{}\n", begin_marker("beta"));
        std::fs::write(&file, &broken).unwrap();
        let err = write_section(&file, "beta", &new).unwrap_err();
        assert!(
            err.to_string().contains(&file.display().to_string()),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), broken);
        // Only the file itself in the directory: no temporary file left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_report_section_carries_its_stamp_and_table() {
        let mut r = Report::new(
            "alpha",
            "cargo bench -p x --bench alpha",
            &["what", "ratio"],
        );
        r.row(["ask | tell", "1.10x"]);
        r.note("Goal: at most 1.1x.");
        let stamp = Stamp {
            command: "TENURE_BENCH_REPORT=1 cargo bench -p x --bench alpha".into(),
            machine: "m".into(),
            date: "2026-11-29 06:00 UTC".into(),
            commit: "abc1234".into(),
        };
        let s = r.section(&stamp);
        assert!(s.starts_with("<!-- bench:alpha begin -->\n"), "{s}");
        assert!(
            s.ends_with("Goal: at most 1.1x.\n<!-- bench:alpha end -->\n"),
            "{s}"
        );
        assert!(s.contains("Command: `TENURE_BENCH_REPORT=1 cargo bench -p x --bench alpha`. Machine: m. Date: 2026-11-29 06:00 UTC. Commit: abc1234."), "{s}");
        assert!(
            s.contains("| what | ratio |\n|---|---|\n| ask \\| tell | 1.10x |\n"),
            "{s}"
        );
        // A section rewrites itself in place.
        let doc = format!("# B\n\n{s}\nafter\n");
        assert_eq!(rewrite(&doc, "alpha", &s, Path::new(FILE)).unwrap(), doc);
    }

    #[test]
    fn the_command_names_the_knobs_set_and_not_other_variables() {
        let env = [
            ("TENURE_BENCH_RUNS", "5"),
            ("TENURE_BENCH_REPORT", "1"),
            ("TENURE_SIM_SEED", "7"),
            ("HOME", "/root"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let cmd = full_command("cargo bench -p x --bench y", env);
        let profile = if cfg!(debug_assertions) {
            " --profile dev"
        } else {
            ""
        };
        assert_eq!(
            cmd,
            format!(
                "TENURE_BENCH_REPORT=1 TENURE_BENCH_RUNS=5 TENURE_SIM_SEED=7 cargo bench{profile} -p x --bench y"
            )
        );
    }

    #[test]
    fn only_a_real_run_with_the_variable_at_1_reports() {
        assert!(report_mode_of(false, Some("1")));
        // The test command's bench smoke run never writes, even with the variable set.
        assert!(!report_mode_of(true, Some("1")));
        assert!(!report_mode_of(false, None));
        assert!(!report_mode_of(false, Some("0")));
        // Unit tests run as `cargo test`, as the smoke run does.
        assert!(smoke());
    }
}
