//! Durations (`40s`, `1h30m`) and percentages (`40%`) as written in specs
//! and flags. A leaf: it imports nothing of this crate.

/// Why a duration or percentage was refused; the message names the input
/// and the accepted form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("empty duration; use a value such as 10s, 5m or 1h")]
    EmptyDuration,
    #[error("{input:?} is not a duration; use a value such as 10s, 5m or 1h")]
    NotADuration { input: String },
    #[error("{input:?}: number too large")]
    TooLarge { input: String },
    #[error("{input:?} needs a unit (ms, s, m, h or d)")]
    MissingUnit { input: String },
    #[error("{input:?}: unknown unit {unit:?}; use ms, s, m, h or d")]
    UnknownUnit { input: String, unit: String },
    #[error("must be a percentage such as 40%, got {input:?}")]
    NotAPercentage { input: String },
}

/// Parses a duration such as `500ms`, `40s`, `10m`, `2h` or `1h30m`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, UnitError> {
    use std::time::Duration;
    let s = s.trim();
    if s.is_empty() {
        return Err(UnitError::EmptyDuration);
    }
    let input = || s.to_string();
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(UnitError::NotADuration { input: input() });
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| UnitError::TooLarge { input: input() })?;
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
            "" => return Err(UnitError::MissingUnit { input: input() }),
            other => {
                return Err(UnitError::UnknownUnit {
                    input: input(),
                    unit: other.to_string(),
                })
            }
        };
        total = total.saturating_add(d);
    }
    Ok(total)
}

/// Parses a percentage such as `40%` into a number from 0 to 100.
pub fn parse_percent(s: &str) -> Result<u32, UnitError> {
    s.trim()
        .strip_suffix('%')
        .and_then(|n| n.trim().parse::<u32>().ok())
        .filter(|n| *n <= 100)
        .ok_or_else(|| UnitError::NotAPercentage {
            input: s.to_string(),
        })
}
