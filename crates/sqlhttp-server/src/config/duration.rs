//! The duration syntax of the flags (`--idempotency-ttl`, the timeouts): [`parse_duration`].
//!
//! Parsing only; nothing here knows which setting the duration is for.

use std::time::Duration;

use crate::error::ServerError;

/// Parses a duration as accepted by `--idempotency-ttl`: a positive integer followed by an
/// optional unit, `ms`, `s` (the default), `m`, `h` or `d`.
///
/// ```
/// use std::time::Duration;
/// use sqlhttp_server::parse_duration;
///
/// assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
/// assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
/// assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86_400));
/// assert!(parse_duration("0s").is_err());
/// assert!(parse_duration("soon").is_err());
/// ```
pub fn parse_duration(input: &str) -> Result<Duration, ServerError> {
    let invalid = |reason: &str| ServerError::InvalidDuration {
        input: input.to_owned(),
        reason: reason.to_owned(),
    };
    let trimmed = input.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    if digits.is_empty() {
        return Err(invalid("expected a number followed by ms, s, m, h or d"));
    }
    let value: u64 = digits
        .parse()
        .map_err(|_| invalid("the number is too large"))?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(invalid("unknown unit; use ms, s, m, h or d")),
    };
    let millis = value
        .checked_mul(millis_per_unit)
        .ok_or_else(|| invalid("the duration is too large"))?;
    if millis == 0 {
        return Err(invalid("the duration must be positive"));
    }
    Ok(Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2d").unwrap(), Duration::from_secs(172_800));
        assert_eq!(parse_duration(" 5 ").unwrap(), Duration::from_secs(5));
        for bad in ["", "s", "-1s", "1.5h", "10x", "0", "99999999999999999999d"] {
            assert!(
                matches!(
                    parse_duration(bad),
                    Err(ServerError::InvalidDuration { .. })
                ),
                "{bad}"
            );
        }
    }
}
