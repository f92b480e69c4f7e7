//! Durations (`40s`, `1h30m`) and percentages (`40%`) as written in specs
//! and flags. A leaf: it imports nothing of this crate.

/// Parses a duration such as `500ms`, `40s`, `10m`, `2h` or `1h30m`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    use std::time::Duration;
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration; use a value such as 10s, 5m or 1h".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!(
                "{s:?} is not a duration; use a value such as 10s, 5m or 1h"
            ));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("{s:?}: number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let d = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            "h" => Duration::from_secs(n.saturating_mul(3600)),
            "d" => Duration::from_secs(n.saturating_mul(86400)),
            "" => return Err(format!("{s:?} needs a unit (ms, s, m, h or d)")),
            other => {
                return Err(format!(
                    "{s:?}: unknown unit {other:?}; use ms, s, m, h or d"
                ))
            }
        };
        total = total.saturating_add(d);
    }
    Ok(total)
}

/// Parses a percentage such as `40%` into a number from 0 to 100.
pub fn parse_percent(s: &str) -> Result<u32, String> {
    s.trim()
        .strip_suffix('%')
        .and_then(|n| n.trim().parse::<u32>().ok())
        .filter(|n| *n <= 100)
        .ok_or_else(|| format!("must be a percentage such as 40%, got {s:?}"))
}
