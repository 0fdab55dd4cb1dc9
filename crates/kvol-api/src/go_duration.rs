//! Durations written as kubelet's flags take them (Go's `time.ParseDuration`: `1m0s`, `90s`, `1h30m`, `250ms`, `0`).

use std::time::Duration;

/// Reads a Go duration: one or more decimal numbers, each with a unit (`h`, `m`, `s`, `ms`,
/// `us` or `µs`, `ns`), or a bare `0`. Negative durations are refused: no kvol flag takes one.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let invalid = |why: &str| format!("invalid duration {text:?}: {why}");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(invalid("it is empty"));
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest.starts_with('-') {
        return Err(invalid("it is negative"));
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_end);
        if number.is_empty() || number == "." {
            return Err(invalid("a number is missing"));
        }
        let value: f64 = number.parse().map_err(|_| invalid("a number is malformed"))?;
        let unit_end = after.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let seconds = match unit {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" | "μs" => 1e-6,
            "ns" => 1e-9,
            "" => return Err(invalid("a unit is missing (h, m, s, ms, us, ns)")),
            other => return Err(invalid(&format!("unknown unit {other:?}"))),
        };
        total += value * seconds;
        rest = next;
    }
    Duration::try_from_secs_f64(total).map_err(|_| invalid("it is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_read_as_go_reads_them() {
        let ok: [(&str, Duration); 9] = [
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("1m0s", Duration::from_secs(60)),
            ("90s", Duration::from_secs(90)),
            ("1h30m", Duration::from_secs(5400)),
            ("250ms", Duration::from_millis(250)),
            ("1.5s", Duration::from_millis(1500)),
            ("+2s", Duration::from_secs(2)),
            ("10us", Duration::from_micros(10)),
        ];
        for (text, want) in ok {
            assert_eq!(parse_go_duration(text), Ok(want), "{text}");
        }
        let bad: [(&str, &str); 7] = [
            ("", "empty"),
            ("60", "unit is missing"),
            ("5d", "unknown unit \"d\""),
            ("-1s", "negative"),
            ("s", "number is missing"),
            ("1..2s", "malformed"),
            ("1m x", "unknown unit"),
        ];
        for (text, want) in bad {
            let error = parse_go_duration(text).expect_err(text);
            assert!(error.contains(want) && error.contains(&format!("{text:?}")), "{text}: {error}");
        }
    }
}
