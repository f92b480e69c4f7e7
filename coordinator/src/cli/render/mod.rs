//! How the operator commands print: what machines report escaped before
//! it reaches a terminal ([`printable`]), ages and times, table rows padded
//! to their columns, an object's name, and a machine's health in a word.
//! The tables of `drover get` are in [`tables`], the texts of `drover
//! describe` and `drover rollout status` in [`describe`].

pub mod describe;
pub(crate) mod progress;
pub use crate::tables;

pub use describe::{describe_machine, rollout_lines};
pub(crate) use progress::{poll, Look};

pub use crate::tables::health_summary;
pub use crate::types::age;

pub(crate) fn print_table(rows: &[Vec<String>]) {
    let widths = column_widths(rows);
    for r in rows {
        println!("{}", table_line(r, &widths));
    }
}

/// The width of each column of `rows`, as printed.
pub(crate) fn column_widths(rows: &[Vec<String>]) -> Vec<usize> {
    let mut widths = vec![0; rows.first().map_or(0, |r| r.len())];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(printable(c).chars().count());
        }
    }
    widths
}

/// One row, its cells padded to `widths` (the last one not).
pub(crate) fn table_line(row: &[String], widths: &[usize]) -> String {
    let line: Vec<String> = row
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let c = printable(c);
            if i + 1 == row.len() {
                c
            } else {
                format!("{c:<w$}", w = widths.get(i).copied().unwrap_or(0))
            }
        })
        .collect();
    line.join("   ").trim_end().to_owned()
}

/// `s` with every control character (terminal escape sequences, carriage
/// returns, newlines, tabs) shown escaped, e.g. `\u{1b}`: what machines
/// report reaches the operator's terminal only as visible text.
pub fn printable(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_owned();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Like [`printable`], keeping the line breaks of a multi-line text this
/// program composed.
pub fn printable_text(s: &str) -> String {
    s.split('\n').map(printable).collect::<Vec<_>>().join("\n")
}

/// A time as RFC 3339, `-` when it cannot be written so.
pub(crate) fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "-".into())
}

/// An object's name: `metadata.name`, else `name`, else `replica.id`.
pub(crate) fn object_name_of(o: &serde_json::Value) -> String {
    o["metadata"]["name"]
        .as_str()
        .or(o["name"].as_str())
        .or(o["replica"]["id"].as_str())
        .unwrap_or("?")
        .to_owned()
}
