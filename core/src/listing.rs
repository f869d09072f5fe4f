//! Names in a sentence, bounded: the first few, then how many more. A job
//! that failed on 16,384 nodes named each of them in its message, and that
//! list was copied into every other node's verdict: a 3 GB report, and a
//! coordinator killed for its memory after a failover (issue 51).

/// How many names a sentence shows.
pub const SHOWN: usize = 8;

/// `items` joined with `sep`, the first `shown` of them, then ` and N more`.
pub fn some<S: AsRef<str>>(items: &[S], shown: usize, sep: &str) -> String {
    let mut s = items
        .iter()
        .take(shown)
        .map(AsRef::as_ref)
        .collect::<Vec<&str>>()
        .join(sep);
    if items.len() > shown {
        s.push_str(&format!(" and {} more", items.len() - shown));
    }
    s
}

/// [`some`] of [`SHOWN`], comma-separated: nodes, GPUs, variables.
pub fn names<S: AsRef<str>>(items: &[S]) -> String {
    some(items, SHOWN, ", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_are_named_and_the_rest_counted() {
        assert_eq!(names::<&str>(&[]), "");
        assert_eq!(names(&["a", "b"]), "a, b");
        let many: Vec<String> = (0..16_384).map(|i| format!("sim-{i:05}")).collect();
        let s = names(&many);
        assert!(s.starts_with("sim-00000, sim-00001,"), "{s}");
        assert!(s.ends_with("sim-00007 and 16376 more"), "{s}");
        assert!(s.len() < 120, "{s}");
        assert_eq!(some(&["x", "y", "z"], 2, "; "), "x; y and 1 more");
    }
}
