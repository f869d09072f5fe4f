//! Parsing and printing of the sizes and durations users type: `64M`, `1GiB`, `15m`.

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
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{t}` is not a size; give bytes like 1048576, 1M or 1GiB"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "ki" | "kib" => 1 << 10,
        "m" | "mb" | "mi" | "mib" => 1 << 20,
        "g" | "gb" | "gi" | "gib" => 1 << 30,
        "t" | "tb" | "ti" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "`{t}` has an unknown unit `{other}`; use K, M, G or T (powers of 1024)"
            ))
        }
    };
    Ok((value * mult as f64).round() as u64)
}

/// Prints bytes the way a person reads them: 1.0 MiB, 64 MiB, 1.0 GiB.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[i])
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
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
        assert!(parse_bytes("-1M").unwrap_err().contains("negative"));
        assert!(parse_bytes("12Q").unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("lots").is_err());
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
