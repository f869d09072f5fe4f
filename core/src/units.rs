//! Parsing and printing of the sizes and durations users type: `64M`, `1GiB`, `15m`.
//! Sizes go through `parse-size` (binary units, as nccl-tests reads them) and
//! `humansize`, durations through `humantime`; this module only adds the checks
//! and the error messages gpuctl's users see.

use humansize::{format_size, BINARY};

/// Parses a byte size: a plain number of bytes, or a number with K, M, G, T
/// (powers of 1024, as nccl-tests reads them), with an optional `i`/`iB`/`B`.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty size; give bytes like 1048576, 1M or 1GiB".into());
    }
    if t.starts_with('-') {
        return Err(format!("`{t}` is negative; give a size like 1M or 1GiB"));
    }
    parse_size::Config::new()
        .with_binary()
        .parse_size(t)
        .map_err(|e| {
            let unit = t.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
            let number_first = unit.len() < t.len();
            match e {
                parse_size::Error::InvalidDigit if number_first => format!(
                    "`{t}` has an unknown unit `{}`; use K, M, G or T (powers of 1024)",
                    unit.trim()
                ),
                parse_size::Error::PosOverflow => format!("`{t}` is too large"),
                _ => format!("`{t}` is not a size; give bytes like 1048576, 1M or 1GiB"),
            }
        })
}

/// Prints bytes the way a person reads them: 1 MiB, 1.5 KiB, 12 B.
pub fn format_bytes(bytes: u64) -> String {
    format_size(bytes, BINARY.decimal_places(1))
}

/// Parses a duration such as `30s`, `15m`, `1h30m` or `500ms`.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let t = text.trim();
    if t.starts_with('-') {
        return Err(format!(
            "`{t}` is negative; give a positive duration like 30s or 15m"
        ));
    }
    let d = humantime::parse_duration(t).map_err(|e| {
        format!("`{t}` is not a duration ({e}); give a duration like 30s, 15m or 1h")
    })?;
    if d.is_zero() {
        return Err(format!(
            "`{t}` is zero; give a positive duration like 30s or 15m"
        ));
    }
    Ok(d)
}

/// Prints a duration compactly: `1m 30s`, `250ms`.
pub fn format_duration_ms(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
    match (h, m) {
        (0, 0) => format!("{:.1}s", ms as f64 / 1000.0),
        (0, _) => format!("{m}m {s:02}s"),
        _ => format!("{h}h {m:02}m {s:02}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_parse_like_nccl_tests() {
        assert_eq!(parse_bytes("1M").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("1.5K").unwrap(), 1536);
        assert_eq!(parse_bytes("25MB").unwrap(), 25 << 20);
        assert_eq!(parse_bytes(" 2 g ").unwrap(), 2 << 30);
        assert!(parse_bytes("-1M").unwrap_err().contains("negative"));
        assert!(parse_bytes("12Q").unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("").is_err());
    }

    #[test]
    fn durations_reject_negative_and_zero() {
        assert_eq!(parse_duration("15m").unwrap().as_secs(), 900);
        assert!(parse_duration("-5m").unwrap_err().contains("negative"));
        assert!(parse_duration("0s").unwrap_err().contains("zero"));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn bytes_print_readably() {
        assert_eq!(format_bytes(1 << 20), "1 MiB");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(12), "12 B");
    }
}
