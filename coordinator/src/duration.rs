//! Human durations for flags: `500ms`, `10s`, `5m`, `1h`, `7d`, or sums like `1h30m`.

use std::time::Duration;

/// Parses a duration flag value.
pub fn parse(s: &str) -> Result<Duration, String> {
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
            "m" => Duration::from_secs(n * 60),
            "h" => Duration::from_secs(n * 3600),
            "d" => Duration::from_secs(n * 86400),
            "" => return Err(format!("{s:?} needs a unit (ms, s, m, h or d)")),
            other => {
                return Err(format!(
                    "{s:?}: unknown unit {other:?}; use ms, s, m, h or d"
                ))
            }
        };
        total += d;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!(parse("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse("10").is_err());
        assert!(parse("ten").is_err());
        assert!(parse("5y").is_err());
    }
}
