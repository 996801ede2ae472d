//! Pearson chi-square statistics for the sampling-exactness tests (the verifier's unit tests, the
//! model-level marginals in `runtime/engine/tests/spec_decode.rs`) and their negative controls: a
//! goodness-of-fit test against known probabilities and a homogeneity test between two samples.
//!
//! Sparse categories are pooled into one bin until every bin's expected count is at least 5 (the usual
//! validity condition); critical values use the Wilson–Hilferty approximation, accurate to a few
//! percent for the degrees of freedom these tests have.

/// A test's outcome.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChiSquare {
    /// Pearson's statistic.
    pub statistic: f64,
    /// Degrees of freedom after pooling.
    pub df: usize,
}

impl ChiSquare {
    /// The critical value at the one-sided normal quantile `z` (3.719 for a level of 1e-4).
    pub fn critical(&self, z: f64) -> f64 {
        critical_value(self.df, z)
    }

    /// Whether the statistic exceeds the critical value at `z` (the samples differ).
    pub fn rejects(&self, z: f64) -> bool {
        self.statistic > self.critical(z)
    }
}

/// The chi-square quantile with `df` degrees of freedom at the normal quantile `z` (Wilson–Hilferty).
pub fn critical_value(df: usize, z: f64) -> f64 {
    let d = df.max(1) as f64;
    let h = 2.0 / (9.0 * d);
    d * (1.0 - h + z * h.sqrt()).powi(3)
}

/// Goodness of fit of `counts` to the probabilities `probs` (same length; `probs` sums to 1).
/// Categories with expected count below 5 are pooled, smallest expectations first.
pub fn goodness_of_fit(counts: &[u64], probs: &[f64]) -> ChiSquare {
    let n: u64 = counts.iter().sum();
    let cells: Vec<(f64, f64)> = counts
        .iter()
        .zip(probs)
        .map(|(&c, &p)| (c as f64, p * n as f64))
        .collect();
    pearson(pool(cells))
}

/// Homogeneity of two samples over the same categories (a 2 × k contingency table); categories whose
/// pooled expected count is below 5 in either row are pooled.
pub fn homogeneity(a: &[u64], b: &[u64]) -> ChiSquare {
    let (na, nb) = (a.iter().sum::<u64>() as f64, b.iter().sum::<u64>() as f64);
    let share = na / (na + nb);
    // Pool on the smaller row's expectation, then compute the 2 × k statistic on the pooled columns.
    let mut cols: Vec<(f64, f64)> = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64, y as f64))
        .filter(|(x, y)| x + y > 0.0)
        .collect();
    cols.sort_by(|p, q| (p.0 + p.1).total_cmp(&(q.0 + q.1)));
    let min_share = share.min(1.0 - share);
    let mut pooled: Vec<(f64, f64)> = Vec::new();
    let mut acc = (0.0, 0.0);
    for c in cols {
        acc = (acc.0 + c.0, acc.1 + c.1);
        if (acc.0 + acc.1) * min_share >= 5.0 {
            pooled.push(acc);
            acc = (0.0, 0.0);
        }
    }
    if acc.0 + acc.1 > 0.0 {
        match pooled.last_mut() {
            Some(last) => *last = (last.0 + acc.0, last.1 + acc.1),
            None => pooled.push(acc),
        }
    }
    let statistic = pooled
        .iter()
        .map(|&(x, y)| {
            let t = x + y;
            let (ex, ey) = (t * share, t * (1.0 - share));
            (x - ex).powi(2) / ex + (y - ey).powi(2) / ey
        })
        .sum();
    ChiSquare {
        statistic,
        df: pooled.len().saturating_sub(1),
    }
}

/// Pools (observed, expected) cells, smallest expectation first, until each has expected >= 5.
fn pool(mut cells: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    cells.retain(|&(o, e)| o > 0.0 || e > 0.0);
    cells.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut out: Vec<(f64, f64)> = Vec::new();
    let mut acc = (0.0, 0.0);
    for c in cells {
        acc = (acc.0 + c.0, acc.1 + c.1);
        if acc.1 >= 5.0 {
            out.push(acc);
            acc = (0.0, 0.0);
        }
    }
    if acc.0 > 0.0 || acc.1 > 0.0 {
        match out.last_mut() {
            Some(last) => *last = (last.0 + acc.0, last.1 + acc.1),
            None => out.push(acc),
        }
    }
    out
}

fn pearson(cells: Vec<(f64, f64)>) -> ChiSquare {
    let statistic = cells
        .iter()
        .map(|&(o, e)| {
            if e > 0.0 {
                (o - e).powi(2) / e
            } else {
                f64::INFINITY
            }
        })
        .sum();
    ChiSquare {
        statistic,
        df: cells.len().saturating_sub(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn critical_values_match_tables() {
        // Tables: χ²(0.999; 10) = 29.59, χ²(0.999; 30) = 59.70, χ²(0.9999; 20) = 52.39.
        for (df, z, want) in [(10, 3.090, 29.59), (30, 3.090, 59.70), (20, 3.719, 52.39)] {
            let got = critical_value(df, z);
            assert!((got - want).abs() / want < 0.03, "df {df}: {got} vs {want}");
        }
    }

    #[test]
    fn statistics_separate_equal_and_different_samples() {
        let probs = [0.5, 0.3, 0.2];
        assert!(goodness_of_fit(&[500, 300, 200], &probs).statistic < 1e-9);
        assert!(goodness_of_fit(&[600, 250, 150], &probs).rejects(3.719));
        let h = homogeneity(&[500, 300, 200, 1], &[490, 310, 200, 0]);
        assert!(!h.rejects(3.719) && h.df == 2, "{h:?}");
        assert!(homogeneity(&[500, 300, 200], &[300, 300, 400]).rejects(3.719));
    }
}
