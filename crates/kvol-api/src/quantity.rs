//! Kubernetes resource quantities (`64Mi`, `1.5G`, `1e3`, `500m`) as whole bytes, rounded up.
//!
//! The grammar is upstream's (`k8s.io/apimachinery/pkg/api/resource`): an optionally signed
//! decimal number, then one suffix: binary `Ki Mi Gi Ti Pi Ei`, decimal `n u m k M G T P E` or
//! none, or an exponent `e<int>` / `E<int>`. A fraction of a byte rounds up, as upstream's
//! `Quantity.Value()` does.

/// Why a quantity is not a byte count.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("it is empty")]
    Empty,
    #[error("it has no digits")]
    NoDigits,
    #[error(
        "{suffix:?} is not a quantity suffix (binary Ki Mi Gi Ti Pi Ei, decimal n u m k M G T P E, or an exponent such as e3)"
    )]
    UnknownSuffix { suffix: String },
    #[error("it has more than {} significant digits", MAX_SIGNIFICANT_DIGITS)]
    TooPrecise,
    #[error("it is negative")]
    Negative,
    #[error("it is more than {} bytes", u64::MAX)]
    TooLarge,
}

/// More significant digits than a `u64` byte count can carry are a typo, not a size.
const MAX_SIGNIFICANT_DIGITS: usize = 20;

/// The multiplier a suffix stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scale {
    /// `10^n`.
    Decimal(i64),
    /// `2^n`.
    Binary(u32),
}

/// The multiplier of a suffix, or `None` when it is not one.
fn scale_of(suffix: &str) -> Option<Scale> {
    let scale = match suffix {
        "" => Scale::Decimal(0),
        "n" => Scale::Decimal(-9),
        "u" => Scale::Decimal(-6),
        "m" => Scale::Decimal(-3),
        "k" => Scale::Decimal(3),
        "M" => Scale::Decimal(6),
        "G" => Scale::Decimal(9),
        "T" => Scale::Decimal(12),
        "P" => Scale::Decimal(15),
        "E" => Scale::Decimal(18),
        "Ki" => Scale::Binary(10),
        "Mi" => Scale::Binary(20),
        "Gi" => Scale::Binary(30),
        "Ti" => Scale::Binary(40),
        "Pi" => Scale::Binary(50),
        "Ei" => Scale::Binary(60),
        _ => {
            let exponent = suffix.strip_prefix(['e', 'E'])?;
            // Parsing takes a leading `+` or `-`, as Go's ParseInt does, and refuses an empty exponent.
            Scale::Decimal(exponent.parse::<i32>().ok()?.into())
        }
    };
    Some(scale)
}

/// Parses a quantity into whole bytes, rounding a fraction of a byte up.
pub fn parse_bytes(text: &str) -> Result<u64, QuantityError> {
    if text.is_empty() {
        return Err(QuantityError::Empty);
    }
    let (negative, unsigned) = match text.as_bytes()[0] {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let integer_end = unsigned.find(|c: char| !c.is_ascii_digit()).unwrap_or(unsigned.len());
    let (integer, rest) = unsigned.split_at(integer_end);
    let (fraction, suffix) = match rest.strip_prefix('.') {
        Some(after_point) => {
            let fraction_end = after_point.find(|c: char| !c.is_ascii_digit()).unwrap_or(after_point.len());
            after_point.split_at(fraction_end)
        }
        None => ("", rest),
    };
    if integer.is_empty() && fraction.is_empty() {
        return Err(QuantityError::NoDigits);
    }
    let scale =
        scale_of(suffix).ok_or_else(|| QuantityError::UnknownSuffix { suffix: suffix.to_string() })?;

    // The value is `digits × 10^(−fraction digits) × scale`; trailing zeros of the fraction
    // and leading zeros of the whole carry nothing.
    let fraction = fraction.trim_end_matches('0');
    let digits = format!("{integer}{fraction}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Ok(0);
    }
    if negative {
        return Err(QuantityError::Negative);
    }
    if digits.len() > MAX_SIGNIFICANT_DIGITS {
        return Err(QuantityError::TooPrecise);
    }
    // At most 20 digits: below 10^20 < 2^67, so a binary scale (at most 2^60) cannot overflow.
    let mut mantissa: u128 = digits.parse().map_err(|_| QuantityError::NoDigits)?;
    let fraction_digits = fraction.len() as i64;
    let decimal_exponent = match scale {
        Scale::Binary(bits) => {
            mantissa <<= bits;
            -fraction_digits
        }
        Scale::Decimal(exponent) => exponent - fraction_digits,
    };
    let bytes = if decimal_exponent >= 0 {
        let power = u32::try_from(decimal_exponent).ok().and_then(|e| 10u128.checked_pow(e));
        power.and_then(|p| mantissa.checked_mul(p)).ok_or(QuantityError::TooLarge)?
    } else {
        match u32::try_from(-decimal_exponent).ok().and_then(|e| 10u128.checked_pow(e)) {
            Some(divisor) => mantissa.div_ceil(divisor),
            // A divisor beyond u128 is beyond the mantissa too: a positive sliver of a byte.
            None => 1,
        }
    };
    u64::try_from(bytes).map_err(|_| QuantityError::TooLarge)
}

/// `bytes` as a quantity a person reads: the largest binary suffix that divides it exactly
/// (`32Mi`, `1536Mi`), else plain bytes; it parses back to the same number.
pub fn format_bytes(bytes: u64) -> String {
    const SUFFIXES: [(&str, u32); 5] = [("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)];
    SUFFIXES
        .iter()
        .find(|(_, shift)| bytes != 0 && bytes.trailing_zeros() >= *shift)
        .map_or_else(|| bytes.to_string(), |(suffix, shift)| format!("{}{suffix}", bytes >> shift))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_shown_with_the_largest_exact_suffix() {
        let cases = [
            (0, "0"),
            (1000, "1000"),
            (1024, "1Ki"),
            (33_554_432, "32Mi"),
            (1536 << 20, "1536Mi"),
            (2 << 30, "2Gi"),
        ];
        for (bytes, want) in cases {
            assert_eq!(format_bytes(bytes), want);
            assert_eq!(parse_bytes(want), Ok(bytes));
        }
    }

    #[test]
    fn quantities_parse_to_bytes() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("1", 1),
            ("+7", 7),
            ("123456", 123_456),
            ("1k", 1_000),
            ("1M", 1_000_000),
            ("2G", 2_000_000_000),
            ("1T", 1_000_000_000_000),
            ("1P", 1_000_000_000_000_000),
            ("1E", 1_000_000_000_000_000_000),
            ("1Ki", 1_024),
            ("64Mi", 67_108_864),
            ("1Gi", 1_073_741_824),
            ("1.5Gi", 1_610_612_736),
            ("1Ti", 1 << 40),
            ("1Pi", 1 << 50),
            ("1Ei", 1 << 60),
            ("15Ei", 15 << 60),
            ("1e3", 1_000),
            ("1E3", 1_000),
            ("1e+3", 1_000),
            ("2.5e2", 250),
            ("12e-1", 2),
            ("0.5", 1),
            (".5", 1),
            ("5.", 5),
            ("1.000", 1),
            ("00012", 12),
            ("500m", 1),
            ("1500m", 2),
            ("2000m", 2),
            ("1n", 1),
            ("1u", 1),
            ("0m", 0),
            ("-0", 0),
            ("1e-400", 1),
            ("0e999", 0),
            ("18446744073709551615", u64::MAX),
        ];
        for &(text, bytes) in cases {
            assert_eq!(parse_bytes(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn garbage_is_rejected_with_the_reason() {
        let unknown = |s: &str| QuantityError::UnknownSuffix { suffix: s.to_string() };
        let cases: &[(&str, QuantityError)] = &[
            ("", QuantityError::Empty),
            ("Gi", QuantityError::NoDigits),
            ("-", QuantityError::NoDigits),
            (".", QuantityError::NoDigits),
            ("1ki", unknown("ki")),
            ("1KB", unknown("KB")),
            ("1 Gi", unknown(" Gi")),
            ("1e", unknown("e")),
            ("1e3Ki", unknown("e3Ki")),
            ("1.2.3", unknown(".3")),
            ("1e99999999999", unknown("e99999999999")),
            ("ten", QuantityError::NoDigits),
            ("-1", QuantityError::Negative),
            ("-64Mi", QuantityError::Negative),
            ("18446744073709551616", QuantityError::TooLarge),
            ("16Ei", QuantityError::TooLarge),
            ("1e20", QuantityError::TooLarge),
            ("1e400", QuantityError::TooLarge),
            ("123456789012345678901", QuantityError::TooPrecise),
        ];
        for (text, error) in cases {
            assert_eq!(parse_bytes(text).as_ref(), Err(error), "{text}");
        }
    }

    #[test]
    fn errors_read_as_reasons() {
        assert_eq!(
            parse_bytes("3q").unwrap_err().to_string(),
            "\"q\" is not a quantity suffix (binary Ki Mi Gi Ti Pi Ei, decimal n u m k M G T P E, or an exponent such as e3)"
        );
        assert_eq!(parse_bytes("-1").unwrap_err().to_string(), "it is negative");
    }
}
