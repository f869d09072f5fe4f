//! The tables as CSV (for a spreadsheet) and as GitHub pipe tables (for a
//! ticket): the same cells the aligned table shows, under the same headers.
//! Several tables (a report's findings, nodes, ranks) become sections: in CSV
//! a `# name` line before each and a blank line between; in Markdown a heading.

use anyhow::Result;

use super::table::Table;

/// A titled table; the title is the section's name (`ranks`, `nodes`).
pub struct Section {
    pub title: String,
    pub table: Table,
}

impl Section {
    pub fn new(title: &str, table: Table) -> Self {
        Section {
            title: title.to_string(),
            table,
        }
    }
}

/// The tables' `-` placeholder means "no figure": a spreadsheet wants an empty cell.
fn csv_cell(s: &str) -> &str {
    if s == "-" {
        ""
    } else {
        s
    }
}

/// One table as CSV: a header row, then one record per row (short rows padded).
pub fn csv(t: &Table) -> Result<String> {
    let mut w = csv::WriterBuilder::new().from_writer(Vec::new());
    let width = t.headers().len();
    w.write_record(t.headers())?;
    for row in t.rows() {
        let mut cells: Vec<&str> = row.iter().map(|c| csv_cell(c)).collect();
        cells.resize(width.max(cells.len()), "");
        w.write_record(&cells)?;
    }
    Ok(String::from_utf8(w.into_inner()?)?)
}

/// Several tables in one CSV text: `# title`, the table, a blank line.
pub fn csv_sections(sections: &[Section]) -> Result<String> {
    let mut s = String::new();
    for (i, sec) in sections.iter().enumerate() {
        if i > 0 {
            s.push('\n');
        }
        s.push_str(&format!("# {}\n", sec.title));
        s.push_str(&csv(&sec.table)?);
    }
    Ok(s)
}

/// A pipe in a cell would end it; a newline would end the row.
fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// One table as a GitHub pipe table.
pub fn markdown(t: &Table) -> String {
    let width = t.headers().len();
    let line = |cells: &[String]| {
        let mut cells: Vec<String> = cells.iter().map(|c| md_cell(c)).collect();
        cells.resize(width.max(cells.len()), String::new());
        format!("| {} |\n", cells.join(" | "))
    };
    let mut s = line(t.headers());
    s.push_str(&format!("|{}\n", "---|".repeat(width)));
    for row in t.rows() {
        s.push_str(&line(row));
    }
    s
}

/// Several tables, each under a `### title` heading.
pub fn markdown_sections(sections: &[Section]) -> String {
    let mut s = String::new();
    for sec in sections {
        s.push_str(&format!("\n### {}\n\n", sec.title));
        s.push_str(&markdown(&sec.table));
    }
    s
}

/// Prints one table as CSV or Markdown (`-o csv|md` of the listings).
pub fn print(t: &Table, out: super::OutputFormat) -> Result<()> {
    let text = match out {
        super::OutputFormat::Csv => csv(t)?,
        _ => markdown(t),
    };
    super::print_text(&text);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        let mut t = Table::new(&["NODE", "VERDICT", "REASON"]);
        t.row(["local-0", "pass", "-"]);
        t.row(["local-1", "fail", "a, b | c"]);
        t
    }

    #[test]
    fn csv_quotes_commas_and_empties_dashes() {
        assert_eq!(
            csv(&table()).unwrap(),
            "NODE,VERDICT,REASON\nlocal-0,pass,\nlocal-1,fail,\"a, b | c\"\n"
        );
    }

    #[test]
    fn markdown_escapes_pipes() {
        assert_eq!(
            markdown(&table()),
            "| NODE | VERDICT | REASON |\n|---|---|---|\n| local-0 | pass | - |\n| local-1 | fail | a, b \\| c |\n"
        );
    }

    #[test]
    fn sections_are_titled() {
        let s = csv_sections(&[
            Section::new("nodes", table()),
            Section::new("more", table()),
        ])
        .unwrap();
        assert!(s.starts_with("# nodes\nNODE,"), "{s}");
        assert!(s.contains("\n\n# more\nNODE,"), "{s}");
    }
}
