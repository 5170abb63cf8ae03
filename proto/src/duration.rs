//! Durations as operators write them on command lines and in the
//! environment: `500ms`, `5s`, `2m`, `1h`, `1d`, or bare seconds (`1.5`).
//! One parser for every binary and SDK, so a flag means the same thing
//! everywhere.

use std::time::Duration;

/// Longest duration accepted (about 317 years): beyond it a typo, not a plan.
const MAX_SECONDS: f64 = 1e10;

/// A duration that could not be parsed; the text says what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?}: use a non-negative number with ms, s, m, h or d (e.g. 500ms, 5s, 2m), or bare seconds")]
pub struct DurationError(pub String);

/// Parses `500ms`, `5s`, `2m`, `1h`, `1d` (and Mesos's spellings `secs`,
/// `min`, `mins`, `hrs`, `days`) or bare, possibly fractional, seconds. Negative, NaN and absurdly large values are refused.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(agora_proto::parse_duration("500ms").unwrap(), Duration::from_millis(500));
/// assert!(agora_proto::parse_duration("-1s").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let err = || DurationError(text.to_string());
    let t = text.trim();
    let split = t
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale = match unit {
        "" | "s" | "secs" => 1.0,
        "ms" => 0.001,
        "m" | "min" | "mins" => 60.0,
        "h" | "hrs" => 3600.0,
        "d" | "days" => 86400.0,
        "w" | "weeks" => 7.0 * 86400.0,
        _ => return Err(err()),
    };
    let value: f64 = number.trim().parse().map_err(|_| err())?;
    let seconds = value * scale;
    if !seconds.is_finite() || !(0.0..=MAX_SECONDS).contains(&seconds) {
        return Err(err());
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_forms() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration(" 2m ").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("2min").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("15mins").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86400));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
    }

    #[test]
    fn refused_forms() {
        for bad in [
            "",
            "-1s",
            "abc",
            "nan",
            "inf",
            "5x",
            "1e300",
            "s",
            "5 parsecs",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.to_string().contains("invalid duration"), "{bad}: {e}");
        }
    }
}
