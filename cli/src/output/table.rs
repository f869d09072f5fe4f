//! Every table the CLI prints, kubectl style: upper-case headers, columns
//! separated by spaces, no borders (what people paste into tickets and diff run
//! over run). Layout is comfy-table's; this module only fixes the look. On a
//! terminal, wide tables wrap their cells to the window's width; piped or
//! redirected, a row stays one line so `grep` and `less` see whole rows.

use std::io::IsTerminal;

use comfy_table::{presets::NOTHING, CellAlignment, ColumnConstraint, ContentArrangement, Width};

/// Spaces between columns; three keep adjacent numeric columns readable.
const GAP: u16 = 3;
/// Between a key and its value in a `KEY  value` block.
const KEY_GAP: u16 = 2;
/// Cells up to this wide never wrap; wider ones (free text) wrap, down to this.
const WRAP_MIN: u16 = 24;

/// A table with a header row; cells are plain text.
pub struct Table {
    inner: comfy_table::Table,
    // The plain cells too, for the CSV and Markdown renderings (output::grid).
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<S: AsRef<str>>(headers: &[S]) -> Self {
        let mut inner = comfy_table::Table::new();
        inner
            .load_preset(NOTHING)
            .set_header(headers.iter().map(|h| h.as_ref().to_string()));
        Table {
            inner,
            headers: headers.iter().map(|h| h.as_ref().to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Right-aligns the named columns (numbers read better that way).
    pub fn right(mut self, columns: &[usize]) -> Self {
        for &c in columns {
            if let Some(col) = self.inner.column_mut(c) {
                col.set_cell_alignment(CellAlignment::Right);
            }
        }
        self
    }

    /// Adds a row; a short row leaves its last cells empty.
    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let cells: Vec<String> = cells.into_iter().map(Into::into).collect();
        self.inner.add_row(cells.clone());
        self.rows.push(cells);
    }

    pub fn headers(&self) -> &[String] {
        &self.headers
    }

    pub fn rows(&self) -> &[Vec<String>] {
        &self.rows
    }

    /// The table as text, one line per row (more on a narrow terminal), each
    /// line ending in a newline.
    pub fn render(self) -> String {
        layout(self.inner, GAP, terminal_width())
    }
}

/// A `KEY  value` block for headers of single objects (a job, a report).
pub fn key_values(pairs: &[(&str, String)]) -> String {
    let mut inner = comfy_table::Table::new();
    inner.load_preset(NOTHING);
    for (k, v) in pairs {
        inner.add_row([k.to_string(), v.clone()]);
    }
    layout(inner, KEY_GAP, terminal_width())
}

/// The window's width when stdout is a terminal; None when it is a pipe or a
/// file, and always in unit tests, so their expectations do not depend on the
/// terminal that runs them.
fn terminal_width() -> Option<u16> {
    if cfg!(test) || !std::io::stdout().is_terminal() {
        return None;
    }
    console::Term::stdout()
        .size_checked()
        .map(|(_rows, cols)| cols)
}

/// Pads every column but the last by `gap` on the right, then lets comfy-table
/// arrange the cells: wrapped into `width` when known, unbroken otherwise.
/// Only free text wraps (at spaces, never narrower than [`WRAP_MIN`]); names,
/// numbers and states keep their width, and a table that cannot fit even so is
/// left unbroken for the terminal to fold rather than cutting `local-0` in two.
fn layout(mut t: comfy_table::Table, gap: u16, width: Option<u16>) -> String {
    let n = t.column_count();
    let widest = t.column_max_content_widths();
    for (i, col) in t.column_iter_mut().enumerate() {
        col.set_padding((0, if i + 1 < n { gap } else { 0 }));
        col.set_constraint(if widest.get(i).is_some_and(|w| *w > WRAP_MIN) {
            ColumnConstraint::LowerBoundary(Width::Fixed(WRAP_MIN))
        } else {
            ColumnConstraint::ContentWidth
        });
    }
    // When even the narrowest layout overflows, wrapping text only adds lines.
    let narrowest: u16 = widest
        .iter()
        .map(|w| (*w).min(WRAP_MIN).saturating_add(gap))
        .sum();
    match width.filter(|w| narrowest <= *w) {
        Some(w) => {
            t.set_width(w)
                .set_content_arrangement(ContentArrangement::Dynamic);
        }
        None => {
            t.set_content_arrangement(ContentArrangement::Disabled);
        }
    }
    let mut out = String::new();
    for line in t.lines() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align() {
        let mut t = Table::new(&["NAME", "N"]).right(&[1]);
        t.row(["a", "1"]);
        t.row(["longer", "100"]);
        assert_eq!(t.render(), "NAME       N\na          1\nlonger   100\n");
    }

    #[test]
    fn short_rows_are_padded() {
        let mut t = Table::new(&["A", "B", "C"]);
        t.row(["x"]);
        assert_eq!(t.render(), "A   B   C\nx\n");
    }

    #[test]
    fn key_values_line_up() {
        let s = key_values(&[("JOB", "job-1".into()), ("DURATION", "3s".into())]);
        assert_eq!(s, "JOB       job-1\nDURATION  3s\n");
    }

    fn wide() -> comfy_table::Table {
        let mut t = Table::new(&["NODE", "DETAIL"]);
        t.row([
            "node-0",
            "a detail long enough to need wrapping on a narrow terminal",
        ]);
        t.inner
    }

    #[test]
    fn a_terminal_wraps_to_its_width_and_a_pipe_never_breaks_a_row() {
        let narrow = layout(wide(), GAP, Some(40));
        assert!(narrow.lines().count() > 2, "{narrow}");
        assert!(narrow.lines().all(|l| l.chars().count() <= 40), "{narrow}");
        assert!(
            narrow.starts_with("NODE     DETAIL\nnode-0   a detail"),
            "{narrow}"
        );
        let piped = layout(wide(), GAP, None);
        assert_eq!(piped.lines().count(), 2, "{piped}");
        assert!(piped.lines().nth(1).unwrap().ends_with("narrow terminal"));
        // Too narrow for even the names: left whole for the terminal to fold.
        assert_eq!(layout(wide(), GAP, Some(20)), piped);
    }
}
