//! Plain aligned tables, kubectl style: upper-case headers, columns separated by
//! spaces, no borders. Hand-rolled because the needs are small and a borderless
//! layout is what people paste into tickets and diff run over run.

/// How a column's cells line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

/// Column gap; three spaces keep adjacent numeric columns readable.
const GAP: &str = "   ";

impl Table {
    pub fn new<S: AsRef<str>>(headers: &[S]) -> Self {
        Table {
            headers: headers.iter().map(|h| h.as_ref().to_string()).collect(),
            align: vec![Align::Left; headers.len()],
            rows: Vec::new(),
        }
    }

    /// Right-aligns the named columns (numbers read better that way).
    pub fn right(mut self, columns: &[usize]) -> Self {
        for &c in columns {
            if c < self.align.len() {
                self.align[c] = Align::Right;
            }
        }
        self
    }

    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut r: Vec<String> = cells.into_iter().map(Into::into).collect();
        r.resize(self.headers.len(), String::new());
        self.rows.push(r);
    }

    pub fn render(&self) -> String {
        let n = self.headers.len();
        let mut width: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(n) {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        let mut line = |cells: &[String]| {
            let mut l = String::new();
            for (i, c) in cells.iter().enumerate().take(n) {
                if i > 0 {
                    l.push_str(GAP);
                }
                let pad = width[i].saturating_sub(c.chars().count());
                match self.align[i] {
                    Align::Left => {
                        l.push_str(c);
                        l.push_str(&" ".repeat(pad));
                    }
                    Align::Right => {
                        l.push_str(&" ".repeat(pad));
                        l.push_str(c);
                    }
                }
            }
            out.push_str(l.trim_end());
            out.push('\n');
        };
        line(&self.headers);
        for r in &self.rows {
            line(r);
        }
        out
    }
}

/// A `KEY  value` block for headers of single objects (a job, a report).
pub fn key_values(pairs: &[(&str, String)]) -> String {
    let w = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in pairs {
        out.push_str(&format!("{k:<w$}  {v}\n"));
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
}
