//! Reading Prometheus text exposition (format 0.0.4): the samples of a `/metrics` page with their
//! labels, for the binaries that scrape each other — the gateway reads runtime pods' load, the
//! operator reads the gateway's pending requests.
//!
//! Invariants: comments and blank lines are skipped; label values are unescaped (`\\`, `\"`, `\n`);
//! a line that cannot be parsed, or a value that is not a finite number, is an error naming the line
//! (silence must never read as "idle"); the optional timestamp after the value is ignored.

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample<'a> {
    /// The metric name (with `_total`, `_bucket`… suffixes as written).
    pub name: &'a str,
    /// Label pairs in the order written, values unescaped.
    pub labels: Vec<(&'a str, String)>,
    /// The value.
    pub value: f64,
}

impl Sample<'_> {
    /// The value of label `name`, if present.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The samples of `text`, one per sample line.
pub fn samples(text: &str) -> impl Iterator<Item = Result<Sample<'_>, String>> {
    text.lines().filter_map(|line| {
        let line = line.trim();
        (!line.is_empty() && !line.starts_with('#')).then(|| parse_line(line))
    })
}

/// The samples of metric `name` in `text` (other metrics are skipped without being parsed further).
pub fn samples_of<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = Result<Sample<'a>, String>> {
    text.lines().filter_map(move |line| {
        let line = line.trim();
        let rest = line.strip_prefix(name)?;
        rest.starts_with(['{', ' ', '\t']).then(|| parse_line(line))
    })
}

fn parse_line(line: &str) -> Result<Sample<'_>, String> {
    let bad = |why: &str| format!("{why}: {line}");
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .ok_or_else(|| bad("no value"))?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(mut body) = rest.strip_prefix('{') {
        loop {
            body = body.trim_start_matches([' ', ',']);
            if let Some(after) = body.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = body.find('=').ok_or_else(|| bad("label without '='"))?;
            let key = body[..eq].trim();
            let quoted = body[eq + 1..]
                .trim_start()
                .strip_prefix('"')
                .ok_or_else(|| bad("unquoted label value"))?;
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let end = loop {
                match chars.next() {
                    Some((i, '"')) => break i,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c)) => value.push(c),
                        None => return Err(bad("unterminated label value")),
                    },
                    Some((_, c)) => value.push(c),
                    None => return Err(bad("unterminated label value")),
                }
            };
            labels.push((key, value));
            body = &quoted[end + 1..];
        }
    }
    let value: f64 = rest
        .split_whitespace()
        .next()
        .ok_or_else(|| bad("no value"))?
        .parse()
        .map_err(|_| bad("unparsable value"))?;
    if !value.is_finite() {
        return Err(bad("non-finite value"));
    }
    Ok(Sample { name, labels, value })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (name, labels, value) of a sample line.
    type Expected<'a> = (&'a str, &'a [(&'a str, &'a str)], f64);

    fn check(line: &str, expected: Result<Expected, &str>) {
        let got = parse_line(line);
        match expected {
            Ok((name, labels, value)) => {
                let s = got.unwrap_or_else(|e| panic!("{line:?}: {e}"));
                assert_eq!(s.name, name);
                let l: Vec<(&str, &str)> = s.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                assert_eq!(l, labels);
                assert_eq!(s.value, value);
            }
            Err(fragment) => {
                let e = got.unwrap_err();
                assert!(e.contains(fragment), "{e:?} lacks {fragment:?}");
            }
        }
    }

    #[test]
    fn lines() {
        check("up 1", Ok(("up", &[], 1.0)));
        check("m{a=\"b\"} 2.5 1700000000", Ok(("m", &[("a", "b")], 2.5)));
        check(
            "m{a=\"x} y\",b=\"q\\\"r\\\\s\\nt\",} 3",
            Ok(("m", &[("a", "x} y"), ("b", "q\"r\\s\nt")], 3.0)),
        );
        check("m{} 4", Ok(("m", &[], 4.0)));
        check("m{a=\"b\"}", Err("no value"));
        check("m NaN", Err("non-finite"));
        check("m{a=b} 1", Err("unquoted"));
        check("m{a=\"b} 1", Err("unterminated"));
        check("m x", Err("unparsable"));
    }

    #[test]
    fn picks_one_metric() {
        let text = "# HELP g x\ng_total{a=\"1\"} 5\ng{a=\"1\"} 2\ng{a=\"2\"} 3\ngx 9\n\n";
        let got: Vec<f64> = samples_of(text, "g").map(|s| s.unwrap().value).collect();
        assert_eq!(got, [2.0, 3.0]);
        assert_eq!(samples(text).count(), 4);
        let s = samples_of(text, "g").next().unwrap().unwrap();
        assert_eq!(s.label("a"), Some("1"));
        assert_eq!(s.label("b"), None);
    }
}
