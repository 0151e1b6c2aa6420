//! `config/reference.toml`, the reference users read, is every crate's fragment together:
//! tenure-lease's (`[tenure]`, `[lease]` and its built-in sections) with each store crate's
//! options under its `[lease.<kind>]`, then the cluster's, the management endpoint's, the
//! singleton's and sharding's sections. Each crate checks its fragment against its defaults;
//! this checks the file against the fragments. `TENURE_BLESS=1` rewrites the file.

use std::path::Path;

/// The fragments put together.
fn assembled() -> String {
    let mut text = tenure::config::REFERENCE.to_string();
    for (kind, options) in [
        ("sqlite", tenure::sqlite::REFERENCE),
        ("postgres", tenure::postgres::REFERENCE),
        ("etcd", tenure::etcd::REFERENCE),
        ("zookeeper", tenure::zookeeper::REFERENCE),
    ] {
        // Each store's options follow the `store` line of its section.
        let store = format!("[lease.{kind}]\n");
        let line = format!("\nstore = \"{kind}\"\n");
        let section = text.find(&store).expect("a section per store kind");
        let at = section + text[section..].find(&line).expect("its store line") + line.len();
        text.insert_str(at, options);
    }
    for fragment in [
        tenure::cluster::REFERENCE,
        tenure_management::REFERENCE,
        tenure::singleton::REFERENCE,
        tenure::sharding::REFERENCE,
    ] {
        text.push('\n');
        text.push_str(fragment);
    }
    text
}

#[test]
fn the_reference_is_the_fragments_together() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/reference.toml");
    let expected = assembled();
    if std::env::var_os("TENURE_BLESS").is_some() {
        std::fs::write(&path, &expected).expect("write config/reference.toml");
    }
    let actual = std::fs::read_to_string(&path).expect("config/reference.toml");
    assert!(
        actual == expected,
        "config/reference.toml is not the crates' reference fragments together; rewrite it \
         with `TENURE_BLESS=1 cargo test -p tenure --all-features --test reference`"
    );
}

#[test]
fn the_reference_loads_and_every_section_reads_it() {
    let config = tenure::TenureConfig::from_toml_str(&assembled(), "config/reference.toml")
        .expect("the reference loads");
    let provider = tenure::provider(config).expect("provider");
    for name in provider.config().lease_section_names().unwrap() {
        provider.section(&name).expect("store options read");
    }
    let config = provider.config();
    tenure::singleton::SingletonSettings::from_config(config, "s", "sqlite").unwrap();
    tenure::sharding::ShardingSettings::from_config(config, "t", "sqlite").unwrap();
    tenure_management::ManagementSettings::from_config(config).unwrap();
    // The cluster's only required key has no default.
    let err = tenure::cluster::ClusterSettings::from_config(config)
        .unwrap_err()
        .to_string();
    assert!(err.contains("cluster.cookie"), "{err}");
}

/// docs/configuration.md's table of every setting, made from the comments of the reference.
const GENERATED_BEGIN: &str = "<!-- Made from config/reference.toml by tests/reference.rs; rewrite it with TENURE_BLESS=1 cargo test -p tenure --all-features --test reference -->";
const GENERATED_END: &str = "<!-- end of the part made from config/reference.toml -->";

/// A commented-out setting line (`# key = value`): a setting with no value by default.
fn commented_setting(line: &str) -> Option<(&str, &str)> {
    let (key, value) = line.strip_prefix("# ")?.split_once(" = ")?;
    let is_key = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    is_key.then_some((key, value))
}

/// One row of the settings table: the keys that share a comment, and the comment.
#[derive(Default)]
struct Row {
    keys: Vec<(String, String)>,
    text: Vec<String>,
}

impl Row {
    fn render(&self) -> String {
        let cell = |s: &str| s.replace('|', "\\|");
        let names: Vec<String> = self.keys.iter().map(|(k, _)| format!("`{k}`")).collect();
        let defaults: Vec<&str> = self.keys.iter().map(|(_, d)| d.as_str()).collect();
        format!(
            "| {} | {} | {} |\n",
            names.join(", "),
            cell(&defaults.join(", ")),
            cell(&self.text.join(" "))
        )
    }
}

/// The settings of `reference` as Markdown: a table per section, each row the keys that
/// share a comment (set, or commented out: no value by default), their defaults and the
/// comment; a comment followed by a blank line describes the section.
fn settings_doc(reference: &str) -> String {
    let mut out = String::new();
    let mut comment: Vec<String> = Vec::new();
    let mut row: Option<Row> = None;
    let mut in_section = false;
    for line in reference.lines().map(str::trim_end) {
        let setting = commented_setting(line)
            .map(|(k, v)| (k.to_string(), format!("not set (e.g. `{v}`)")))
            .or_else(|| {
                (!line.starts_with('#'))
                    .then(|| line.split_once(" = "))
                    .flatten()
                    .map(|(k, v)| (k.to_string(), format!("`{v}`")))
            });
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            out.extend(row.take().map(|r| r.render()));
            out.push_str(&format!(
                "\n### `[{section}]`\n\n| key | default | meaning |\n|---|---|---|\n"
            ));
            comment.clear();
            in_section = true;
        } else if !in_section {
            continue;
        } else if let Some(setting) = setting {
            // Keys right after keys (no comment between) share the first one's comment.
            match &mut row {
                Some(r) if comment.is_empty() => r.keys.push(setting),
                _ => {
                    out.extend(row.take().map(|r| r.render()));
                    row = Some(Row {
                        keys: vec![setting],
                        text: std::mem::take(&mut comment),
                    });
                }
            }
        } else if let Some(text) = line.strip_prefix('#') {
            out.extend(row.take().map(|r| r.render()));
            comment.push(text.trim().to_string());
        } else if line.is_empty() {
            out.extend(row.take().map(|r| r.render()));
            if !comment.is_empty() {
                let note = Row {
                    keys: Vec::new(),
                    text: std::mem::take(&mut comment),
                };
                out.push_str(&note.render().replacen("|  |  |", "| | |", 1));
            }
        }
    }
    out.extend(row.take().map(|r| r.render()));
    out
}

#[test]
fn the_configuration_manual_lists_every_setting_of_the_reference() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = root.join("docs/configuration.md");
    let doc = std::fs::read_to_string(&path).expect("docs/configuration.md");
    let (head, rest) = doc
        .split_once(GENERATED_BEGIN)
        .expect("docs/configuration.md has the generated part's first marker");
    let (_, tail) = rest
        .split_once(GENERATED_END)
        .expect("docs/configuration.md has the generated part's last marker");
    let expected = format!(
        "{head}{GENERATED_BEGIN}\n{}\n{GENERATED_END}{tail}",
        settings_doc(&assembled())
    );
    if std::env::var_os("TENURE_BLESS").is_some() {
        std::fs::write(&path, &expected).expect("write docs/configuration.md");
    }
    let actual = std::fs::read_to_string(&path).expect("docs/configuration.md");
    assert!(
        actual == expected,
        "docs/configuration.md's table of settings is not config/reference.toml's; rewrite it \
         with `TENURE_BLESS=1 cargo test -p tenure --all-features --test reference`"
    );
}

#[test]
fn settings_doc_reads_keys_unset_keys_and_section_notes() {
    let doc = settings_doc(
        "# file header\n[a]\n# What a is.\n\n# The x.\nx = 1\n# Two unset.\n# y = \"1s\"\n# z = 2\n\n[b]\nw = true\n",
    );
    assert!(doc.contains("### `[a]`"), "{doc}");
    assert!(doc.contains("| | | What a is. |"), "{doc}");
    assert!(doc.contains("| `x` | `1` | The x. |"), "{doc}");
    assert!(
        doc.contains("| `y`, `z` | not set (e.g. `\"1s\"`), not set (e.g. `2`) | Two unset. |"),
        "{doc}"
    );
    assert!(doc.contains("| `w` | `true` |  |"), "{doc}");
    let shared = settings_doc("[c]\n# Schema and table.\nschema = \"s\"\ntable = \"t\"\n");
    assert!(
        shared.contains("| `schema`, `table` | `\"s\"`, `\"t\"` | Schema and table. |"),
        "{shared}"
    );
    assert!(!doc.contains("file header"), "{doc}");
}
