//! The README's headline figures are the stored run's: the section names
//! one run under `bench/runs/`, and every number in the figure columns of
//! its table (`engine`, `beside it`) must be a figure of that run's
//! `results.json` as printed (rounded to the digits the README shows). A
//! figure copied from another run, typed by hand, or left behind when the
//! run was replaced fails here; goals live in their own column, not
//! checked. It is a presence check, not a row-by-row one: a wrong figure
//! that happens to equal another figure of the same run at the digits
//! printed (a ratio of two decimals among a run's 355 numbers, say)
//! passes; the larger figures (rates, µs with a decimal) rarely can.

use std::path::Path;

use serde_json::Value;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The `## Headline figures` section of the README.
fn headline_section(readme: &str) -> &str {
    let start = readme
        .find("## Headline figures")
        .expect("README has a Headline figures section");
    let rest = &readme[start + 2..];
    let end = rest.find("\n## ").map_or(rest.len(), |i| i + 2);
    &readme[start..start + end]
}

/// The run folder the section names (`bench/runs/<name>/`).
fn named_run(section: &str) -> String {
    let at = section
        .find("bench/runs/")
        .expect("the headline section names its run under bench/runs/");
    section[at..]
        .split(['/', '`', ' ', ')'])
        .nth(2)
        .expect("a run name after bench/runs/")
        .to_owned()
}

/// Every number in a JSON value, recursively.
fn numbers(v: &Value, out: &mut Vec<f64>) {
    match v {
        Value::Number(n) => out.extend(n.as_f64()),
        Value::Array(xs) => xs.iter().for_each(|x| numbers(x, out)),
        Value::Object(m) => m.values().for_each(|x| numbers(x, out)),
        _ => {}
    }
}

/// The numbers written in a table cell, with their decimal places:
/// "42,295 (37,616-48,837)" gives 42295, 37616 and 48837; "1.82x" 1.82.
/// Digits that follow a letter are part of a name ("p99"), not a figure.
fn cell_numbers(cell: &str) -> Vec<(f64, usize)> {
    let mut out = Vec::new();
    let mut token = String::new();
    let mut label = false;
    let mut prev = ' ';
    let flush = |token: &mut String, label: bool, out: &mut Vec<(f64, usize)>| {
        let t = token.trim_end_matches(['.', ',']).replace(',', "");
        if let (false, Ok(x)) = (label, t.parse::<f64>()) {
            let places = t.split_once('.').map_or(0, |(_, d)| d.len());
            out.push((x, places));
        }
        token.clear();
    };
    for c in cell.chars() {
        if c.is_ascii_digit() || (!token.is_empty() && (c == '.' || c == ',')) {
            if token.is_empty() {
                label = prev.is_alphabetic();
            }
            token.push(c);
        } else {
            flush(&mut token, label, &mut out);
        }
        prev = c;
    }
    flush(&mut token, label, &mut out);
    out
}

/// Whether some figure of the run prints as `x` with `places` decimals.
fn printed_in(run: &[f64], x: f64, places: usize) -> bool {
    let half = 0.5 * 10f64.powi(-(places as i32));
    run.iter().any(|y| (y - x).abs() <= half + 1e-9)
}

#[test]
fn every_headline_figure_is_a_figure_of_the_run_the_readme_names() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let section = headline_section(&readme);
    let run = named_run(section);
    let results = root().join("bench/runs").join(&run).join("results.json");
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(&results).unwrap_or_else(|e| panic!("{results:?}: {e}")),
    )
    .expect("results.json is JSON");
    let mut figures = Vec::new();
    numbers(&json, &mut figures);
    let mut rows = section.lines().filter(|l| l.starts_with('|'));
    let header: Vec<&str> = rows
        .next()
        .expect("the section has a table")
        .split('|')
        .map(str::trim)
        .collect();
    let columns: Vec<usize> = header
        .iter()
        .enumerate()
        .filter(|(_, h)| matches!(**h, "engine" | "beside it"))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(columns.len(), 2, "columns engine and beside it: {header:?}");
    let mut wrong = Vec::new();
    let mut checked = 0;
    for row in rows.skip(1) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        for &k in &columns {
            let Some(cell) = cells.get(k) else { continue };
            for (x, places) in cell_numbers(cell) {
                checked += 1;
                if !printed_in(&figures, x, places) {
                    wrong.push(format!("{x} in {cell:?}"));
                }
            }
        }
    }
    assert!(checked >= 8, "the table has its figures ({checked} found)");
    assert!(
        wrong.is_empty(),
        "README figures not in bench/runs/{run}/results.json: {wrong:?}"
    );
}

#[test]
fn a_figure_is_read_with_its_digits_and_matched_only_as_printed() {
    assert_eq!(
        cell_numbers("42,295 (37,616-48,837)"),
        vec![(42295.0, 0), (37616.0, 0), (48837.0, 0)]
    );
    assert_eq!(cell_numbers("1.82x; 18.3 µs."), vec![(1.82, 2), (18.3, 1)]);
    assert_eq!(
        cell_numbers("p50 2.819 ms, p99 13.4"),
        vec![(2.819, 3), (13.4, 1)]
    );
    assert!(printed_in(&[18.34], 18.3, 1));
    assert!(!printed_in(&[18.36], 18.3, 1));
    assert!(!printed_in(&[42295.6], 42295.0, 0));
}
