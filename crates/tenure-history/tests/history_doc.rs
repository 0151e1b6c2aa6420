//! docs/history.md against the history type: its event tables list exactly the kinds of
//! `tenure_history::Event`, each once.

use std::collections::BTreeSet;

use tenure_history::Event;

/// The event kinds of the document's tables whose first column is `event`: the backticked
/// names in that column of each row.
fn documented_kinds(doc: &str) -> Vec<String> {
    let mut kinds = Vec::new();
    let mut in_event_table = false;
    for line in doc.lines() {
        let Some(row) = line.trim().strip_prefix('|') else {
            in_event_table = false;
            continue;
        };
        let first = row.split('|').next().unwrap_or_default().trim();
        if first == "event" {
            in_event_table = true;
            continue;
        }
        if !in_event_table || first.starts_with('-') {
            continue;
        }
        kinds.extend(first.split('`').skip(1).step_by(2).map(str::to_string));
    }
    kinds
}

#[test]
fn the_history_document_lists_every_event_kind_once() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/history.md");
    let doc = std::fs::read_to_string(path).expect("read docs/history.md");
    let documented = documented_kinds(&doc);
    let unique: BTreeSet<&str> = documented.iter().map(String::as_str).collect();
    // `link_cut` and `link_healed` are written by nodes and by harnesses, with different
    // fields: one variant, two rows.
    let twice: Vec<&String> = documented
        .iter()
        .filter(|k| documented.iter().filter(|d| d == k).count() > 1)
        .filter(|k| !k.starts_with("link_"))
        .collect();
    assert!(twice.is_empty(), "documented twice: {twice:?}");
    let known: BTreeSet<&str> = Event::kinds().iter().copied().collect();
    let undocumented: Vec<_> = known.difference(&unique).collect();
    let unknown: Vec<_> = unique.difference(&known).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "in the enum but not in docs/history.md: {undocumented:?}; \
         in docs/history.md but not in the enum: {unknown:?}"
    );
}
