//! nccl-tests' size arguments: integers with optional K/M/G suffixes (powers of 1024).

/// Parses `"8"`, `"128K"`, `"32M"`, `"1G"` (case-insensitive, optional trailing `B`).
///
/// # Errors
/// A message naming the bad input.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix(['B', 'b']).unwrap_or(t);
    let (digits, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("bad size {s:?}: expected e.g. 8, 64K, 32M, 1G"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {s:?} overflows"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn suffixes_are_powers_of_1024() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(65_536));
        assert_eq!(parse_size("32m"), Ok(32 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2KB"), Ok(2048));
        assert!(parse_size("x").is_err());
        assert!(parse_size("").is_err());
    }
}
