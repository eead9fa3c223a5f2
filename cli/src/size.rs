//! Byte sizes on the command line: `1048576`, `512K`, `64M`, `2G` (powers of 1024).

/// Parses one of `bench`'s and `gc-pages`' `--sizes`: MB of live Lua objects, 1..=4096.
pub fn parse_heap_mb(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(mb) if (1..=4096).contains(&mb) => Ok(mb),
        _ => Err(format!(
            "'{text}': --sizes takes MB values in 1..=4096, like `--sizes 1 10 100` or `--sizes 1,10,100`"
        )),
    }
}

/// Parses a size with an optional K/M/G/T suffix (case-insensitive, optional trailing `B`/`iB`).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (digits, shift) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 10),
        Some('m') => (&body[..body.len() - 1], 20),
        Some('g') => (&body[..body.len() - 1], 30),
        Some('t') => (&body[..body.len() - 1], 40),
        _ => (body, 0),
    };
    let n: u64 = digits.trim().parse().map_err(|_| {
        format!(
            "'{text}' is not a size: use a number with an optional K, M, G or T suffix, like 64M"
        )
    })?;
    n.checked_mul(1 << shift)
        .and_then(|b| usize::try_from(b).ok())
        .filter(|&b| b > 0)
        .ok_or_else(|| match n {
            0 => format!("'{text}' is no size: use a size above 0"),
            _ => format!("'{text}' is more bytes than this machine can address"),
        })
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("8MB"), Ok(8 << 20));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("-5M").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
