//! Kubernetes resource quantities, just enough for the downward API's `resourceFieldRef`.
//!
//! Invariants: `parse` accepts the quantity grammar (decimal/binary SI suffixes and `e`
//! exponents) and nothing else; `divide_ceil` renders like the kubelet: the value divided by the
//! divisor, rounded up to an integer (so 500m of CPU with divisor 1 is "1", with divisor 1m "500").

/// The value of a quantity in base units (cores, bytes).
pub fn parse(quantity: &str) -> Result<f64, String> {
    let q = quantity.trim();
    let split = q
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || c == '.' || ((c == '+' || c == '-') && i == 0)))
        .map_or(q.len(), |(i, _)| i);
    let (number, suffix) = q.split_at(split);
    let bad = || format!("invalid quantity {quantity:?}");
    if number.is_empty() || number == "+" || number == "-" {
        return Err(bad());
    }
    let value: f64 = number.parse().map_err(|_| bad())?;
    let multiplier = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        s if s.starts_with(['e', 'E']) => 10f64.powi(s[1..].parse::<i32>().map_err(|_| bad())?),
        _ => return Err(bad()),
    };
    Ok(value * multiplier)
}

/// `ceil(value / divisor)` as an integer string; a zero divisor counts as 1.
pub fn divide_ceil(value: f64, divisor: f64) -> String {
    let divisor = if divisor > 0.0 { divisor } else { 1.0 };
    // Round away float noise (0.1 * 3 / 0.1) before taking the ceiling.
    let ratio = ((value / divisor) * 1e9).round() / 1e9;
    format!("{}", ratio.ceil() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(quantity: &str, divisor: &str, expected: Result<&str, ()>) {
        let got = parse(quantity).and_then(|v| Ok(divide_ceil(v, parse(divisor)?)));
        assert_eq!(
            got.map_err(|_| ()),
            expected.map(str::to_string),
            "{quantity} / {divisor}"
        );
    }

    #[test]
    fn quantities_render_like_the_kubelet() {
        check("2", "1", Ok("2"));
        check("500m", "1", Ok("1"));
        check("500m", "1m", Ok("500"));
        check("1500m", "1", Ok("2"));
        check("0.5", "1m", Ok("500"));
        check("1Gi", "1", Ok("1073741824"));
        check("1Gi", "1Mi", Ok("1024"));
        check("1G", "1Mi", Ok("954"));
        check("128Mi", "1Ki", Ok("131072"));
        check("1e3", "1", Ok("1000"));
        check("1E3", "1k", Ok("1"));
        check("3", "0", Ok("3"));
        check("0", "1", Ok("0"));
        check("100n", "1", Ok("1"));
        check("", "1", Err(()));
        check("abc", "1", Err(()));
        check("1Qi", "1", Err(()));
        check("1e", "1", Err(()));
    }
}
