//! nccl-tests' size arguments: integers with optional K/M/G/T suffixes (powers of 1024), read
//! by the trainer's one byte-count parser ([`zero_alloc::ByteSize`]).

/// Parses `"8"`, `"128K"`, `"32M"`, `"1G"` (case-insensitive, optional `B` after a suffix).
///
/// # Errors
/// A message naming the bad input.
pub fn parse_size(s: &str) -> Result<u64, String> {
    s.parse::<zero_alloc::ByteSize>()
        .map(|b| b.0)
        .map_err(|e| e.to_string())
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
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
        assert!(parse_size("").is_err());
    }
}
