//! Every Rust snippet of README.md and of docs/*.md is an excerpt of an example that CI
//! compiles: its first
//! line names the example (`// examples/x.rs`, or `// crates/<crate>/examples/x.rs` for an
//! example of a workspace crate), lines starting with `// …` stand for omitted code, and
//! every other part must appear in that file in order. Whitespace and the trailing commas
//! rustfmt adds are not compared, so the README may wrap differently.

use std::path::Path;

const ELISION: &str = "// …";

/// The Rust blocks of a Markdown document, each as its lines.
fn rust_blocks<'a>(doc: &str, text: &'a str) -> Vec<Vec<&'a str>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in text.lines() {
        match (&mut current, line.trim_start()) {
            (None, l) if l.starts_with("```rust") => current = Some(Vec::new()),
            (Some(_), l) if l.starts_with("```") => blocks.extend(current.take()),
            (Some(block), _) => block.push(line),
            (None, _) => {}
        }
    }
    assert!(current.is_none(), "{doc}: a ```rust block is not closed");
    blocks
}

/// Code with whitespace removed and rustfmt's trailing commas dropped.
fn normalized(code: &str) -> String {
    let mut s: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    for (from, to) in [(",)", ")"), (",}", "}"), (",]", "]")] {
        s = s.replace(from, to);
    }
    s
}

/// `Err` names the first part of `block` that `source` lacks (in order).
fn excerpt_of(block: &[&str], source: &str) -> Result<(), String> {
    let source = normalized(source);
    let mut from = 0;
    for part in block
        .split(|l| l.trim_start().starts_with(ELISION))
        .map(|lines| lines.join("\n"))
        .filter(|p| !p.trim().is_empty())
    {
        let needle = normalized(&part);
        match source[from..].find(&needle) {
            Some(at) => from += at + needle.len(),
            None => return Err(part),
        }
    }
    Ok(())
}

/// README.md and every Markdown file of docs/, as (path, text).
fn documents(root: &Path) -> Vec<(String, String)> {
    let mut paths = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|p| {
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (
                p.strip_prefix(root).unwrap_or(&p).display().to_string(),
                text,
            )
        })
        .collect()
}

#[test]
fn every_rust_snippet_of_the_docs_is_an_excerpt_of_a_compiled_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut snippets = 0;
    for (doc, text) in documents(root) {
        for block in rust_blocks(&doc, &text) {
            snippets += 1;
            let first = block.first().copied().unwrap_or_default();
            let path = first
                .strip_prefix("// ")
                .filter(|p| {
                    let in_crate = p
                        .strip_prefix("crates/")
                        .and_then(|p| p.split_once('/'))
                        .map_or(*p, |(_, rest)| rest);
                    in_crate.starts_with("examples/") && p.ends_with(".rs")
                })
                .unwrap_or_else(|| panic!("{doc}: a snippet starting {first:?} names no example"));
            let source = std::fs::read_to_string(root.join(path))
                .unwrap_or_else(|e| panic!("{doc}: a snippet names {path}: {e}"));
            if let Err(part) = excerpt_of(&block[1..], &source) {
                panic!("{doc}: a snippet from {path} is not found there (in order):\n{part}");
            }
        }
    }
    assert!(snippets > 0, "README.md and docs/ have Rust snippets");
}

#[test]
fn an_excerpt_must_match_in_order() {
    let source = "fn a() {\n    one(1, 2);\n    two(\n        3,\n    );\n}\n";
    assert_eq!(
        excerpt_of(&["one(1, 2);", "// …", "two(3)"], source),
        Ok(())
    );
    assert!(excerpt_of(&["two(3)", "// …", "one(1, 2);"], source).is_err());
    assert!(excerpt_of(&["one(1, 3);"], source).is_err());
}
