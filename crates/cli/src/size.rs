//! Byte sizes on the command line: `1073741824`, `512M`, `10G`, `1T` (powers of 1024).

/// Parses a size in bytes with an optional K/M/G/T suffix (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = t[i..].to_ascii_uppercase();
            let m: u64 = match unit.trim_end_matches("IB").trim_end_matches('B') {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                _ => return Err(format!("bad size {s:?}: unknown unit (use K, M, G or T)")),
            };
            (&t[..i], m)
        }
        None => (t, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad size {s:?}: expected a number like 10G or 1048576"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn sizes() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("10G").unwrap(), 10 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert!(parse_size("ten").is_err());
        assert!(parse_size("5X").is_err());
    }
}
