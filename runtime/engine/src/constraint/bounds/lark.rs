//! The shape of a Lark grammar (llguidance's dialect) as its compiler will recurse over it, measured by a
//! scanner that mirrors llguidance's own lexer (`lark/lexer.rs`: rule and token names, JSON-syntax
//! strings, `/regex/` literals, `<special>` tokens, `#` and `//` comments, `%json {…}` values) without
//! building a syntax tree.
//!
//! Each statement is a definition (`name: …`, `?name.2[attrs]: …`, `NAME: …`) or a directive
//! (`%ignore …`); it weighs one level plus its deepest bracket nesting, and refers to every defined
//! name in it. The grammar's depth is the longest path through those references
//! ([`super::graph::DepthGraph`]), times one more than the nesting of `%lark {…}` blocks (each nested
//! grammar is compiled inside its parent's compilation). Names are matched over-broadly (a name in an
//! attribute or an alias counts as a reference), so the bound errs high, never low.

use super::graph::DepthGraph;
use serde_json::Value;
use std::collections::HashMap;

/// What the compiler will face in a Lark grammar.
pub(super) struct LarkShape {
    /// Bound on the recursion levels of compiling it.
    pub depth: usize,
    /// The schemas embedded with `%json`, each compiled on its own.
    pub schemas: Vec<Value>,
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Name(String),
    Open,
    Close,
    Colon,
    Newline,
    Bar,
    Other,
}

/// Measures `text`.
pub(super) fn shape(text: &str) -> LarkShape {
    let scanned = scan(text);
    let deepest = scanned
        .grammars
        .iter()
        .map(|toks| definitions(toks).longest_path_bound())
        .max()
        .unwrap_or(0);
    LarkShape {
        depth: deepest.saturating_mul(scanned.lark_nesting + 1),
        schemas: scanned.schemas,
    }
}

/// The definitions of one grammar's tokens and their references.
fn definitions(toks: &[Tok]) -> DepthGraph {
    let mut graph = DepthGraph::default();
    let mut nodes: HashMap<&str, usize> = HashMap::new();
    let mut statements: Vec<(usize, Vec<&str>)> = Vec::new();
    let mut start = 0;
    while start < toks.len() {
        // A statement runs to a newline outside brackets that is not followed by `|`.
        let (mut depth, mut deepest, mut end) = (0usize, 0usize, start);
        while end < toks.len() {
            match &toks[end] {
                Tok::Open => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                Tok::Close => depth = depth.saturating_sub(1),
                Tok::Newline if depth == 0 && toks.get(end + 1) != Some(&Tok::Bar) => break,
                _ => {}
            }
            end += 1;
        }
        let stmt = &toks[start..end];
        start = end + 1;
        if stmt.is_empty() {
            continue;
        }
        let weight = deepest + 1;
        let head = defined_name(stmt);
        let node = match head {
            Some(name) => {
                let n = *nodes.entry(name).or_insert_with(|| graph.node(weight));
                graph.raise(n, weight);
                n
            }
            None => graph.node(weight),
        };
        let names = stmt
            .iter()
            .skip(usize::from(head.is_some()))
            .filter_map(|t| match t {
                Tok::Name(n) => Some(n.as_str()),
                _ => None,
            })
            .collect();
        statements.push((node, names));
    }
    for (from, names) in statements {
        for name in names {
            if let Some(&to) = nodes.get(name) {
                graph.edge(from, to);
            }
        }
    }
    graph
}

/// The name a statement defines: a name, then only a priority, attributes or parameters, then `:`.
fn defined_name(stmt: &[Tok]) -> Option<&str> {
    let Some(Tok::Name(name)) = stmt.first() else {
        return None;
    };
    let mut depth = 0usize;
    for t in &stmt[1..] {
        match t {
            Tok::Colon if depth == 0 => return Some(name),
            Tok::Open => depth += 1,
            Tok::Close => depth = depth.checked_sub(1)?,
            Tok::Newline | Tok::Bar if depth == 0 => return None,
            _ => {}
        }
    }
    None
}

/// A grammar's tokens: the top level's and each `%lark {…}` block's apart.
struct Scanned {
    grammars: Vec<Vec<Tok>>,
    /// Deepest nesting of `%lark` blocks.
    lark_nesting: usize,
    schemas: Vec<Value>,
}

/// Splits `text` into tokens (what the definitions need) and collects its `%json` schemas.
fn scan(text: &str) -> Scanned {
    let b = text.as_bytes();
    let mut out = Scanned {
        grammars: vec![Vec::new()],
        lark_nesting: 0,
        schemas: Vec::new(),
    };
    // The open grammars, innermost last: (index in `grammars`, its bracket depth).
    let mut open: Vec<(usize, usize)> = vec![(0, 0)];
    let mut lark_pending = false;
    let mut i = 0;
    while i < b.len() {
        let top = open.len() - 1;
        let g = open[top].0;
        let c = b[i];
        let tok = match c {
            b' ' | b'\t' | b'\r' => {
                i += 1;
                continue;
            }
            b'\n' => {
                i += 1;
                if out.grammars[g].last() == Some(&Tok::Newline) {
                    continue;
                }
                Tok::Newline
            }
            b'#' => {
                i = line_end(b, i);
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                i = line_end(b, i);
                continue;
            }
            b'/' => {
                i = regex_end(b, i);
                Tok::Other
            }
            b'"' => {
                i = string_end(b, i);
                Tok::Other
            }
            b'<' => {
                i = special_end(b, i);
                Tok::Other
            }
            b'(' | b'[' | b'{' => {
                i += 1;
                if c == b'{' && std::mem::take(&mut lark_pending) {
                    out.grammars[g].push(Tok::Other);
                    out.grammars.push(Vec::new());
                    open.push((out.grammars.len() - 1, 0));
                    out.lark_nesting = out.lark_nesting.max(open.len() - 1);
                    continue;
                }
                open[top].1 += 1;
                Tok::Open
            }
            b')' | b']' | b'}' => {
                i += 1;
                if open[top].1 == 0 && top > 0 {
                    open.pop();
                    continue;
                }
                open[top].1 = open[top].1.saturating_sub(1);
                Tok::Close
            }
            b':' => {
                i += if b.get(i + 1) == Some(&b':') { 2 } else { 1 };
                Tok::Colon
            }
            b'|' => {
                i += 1;
                Tok::Bar
            }
            b'%' => {
                let end = i + 1 + b[i + 1..].iter().take_while(|c| c.is_ascii_alphabetic()).count();
                let word = &text[i + 1..end];
                i = end;
                match word {
                    "json" | "llguidance" | "regex" => {
                        let (value, used) = json_prefix(&b[i..]);
                        if let (Some(v), "json") = (value, word) {
                            out.schemas.push(v);
                        }
                        i += used;
                    }
                    "lark" => lark_pending = true,
                    _ => {}
                }
                Tok::Other
            }
            _ => match name_end(b, i) {
                Some(end) => {
                    let name = text[i..end].trim_start_matches(['!', '?']).to_owned();
                    i = end;
                    Tok::Name(name)
                }
                None => {
                    i += utf8_len(c);
                    Tok::Other
                }
            },
        };
        out.grammars[g].push(tok);
    }
    out
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xF0.. => 4,
        0xE0.. => 3,
        0xC0.. => 2,
        _ => 1,
    }
}

fn line_end(b: &[u8], i: usize) -> usize {
    b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |p| i + p)
}

/// A JSON-syntax string from its opening quote, with llguidance's optional `i` flag.
fn string_end(b: &[u8], i: usize) -> usize {
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            b'"' => return if b.get(j + 1) == Some(&b'i') { j + 2 } else { j + 1 },
            b'\n' => return j,
            _ => j += 1,
        }
    }
    b.len()
}

/// `/(\\.|[^/\\])+/[imslux]*` from its opening slash.
fn regex_end(b: &[u8], i: usize) -> usize {
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            b'/' => {
                j += 1;
                while j < b.len() && b"imslux".contains(&b[j]) {
                    j += 1;
                }
                return j;
            }
            _ => j += 1,
        }
    }
    b.len()
}

/// `<[^<>\s]+>` from its `<` (the opening position itself when it is not one).
fn special_end(b: &[u8], i: usize) -> usize {
    let mut j = i + 1;
    while j < b.len() && !matches!(b[j], b'<' | b'>') && !b[j].is_ascii_whitespace() {
        j += 1;
    }
    if j > i + 1 && b.get(j) == Some(&b'>') {
        j + 1
    } else {
        i + 1
    }
}

/// llguidance's rule (`!?[_?]?[a-z][_a-z0-9\-]*`) and token (`_?[A-Z][_A-Z0-9\-]*`) names.
fn name_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i;
    if b.get(j) == Some(&b'!') {
        j += 1;
    }
    if matches!(b.get(j), Some(b'_' | b'?')) {
        j += 1;
    }
    let first = *b.get(j)?;
    let rest: fn(u8) -> bool = if first.is_ascii_lowercase() {
        |c| c == b'_' || c == b'-' || c.is_ascii_lowercase() || c.is_ascii_digit()
    } else if first.is_ascii_uppercase() && b[i] != b'!' && b[i] != b'?' {
        |c| c == b'_' || c == b'-' || c.is_ascii_uppercase() || c.is_ascii_digit()
    } else {
        return None;
    };
    j += 1;
    while j < b.len() && rest(b[j]) {
        j += 1;
    }
    Some(j)
}

/// One JSON value at the start of `b` (after whitespace) and the bytes it took, as llguidance reads it.
fn json_prefix(b: &[u8]) -> (Option<Value>, usize) {
    let mut stream = serde_json::Deserializer::from_slice(b).into_iter::<Value>();
    match stream.next() {
        Some(Ok(v)) => (Some(v), stream.byte_offset()),
        _ => (None, b.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(g: &str) -> usize {
        shape(g).depth
    }

    fn chain(n: usize) -> String {
        let mut g = String::from("start: r0\n");
        for i in 0..n {
            g.push_str(&format!("r{i}: r{} \"a\" | \"b\"\n", i + 1));
        }
        g.push_str(&format!("r{n}: \"c\"\n"));
        g
    }

    #[test]
    fn depths_of_small_grammars() {
        let cases: &[(&str, usize)] = &[
            ("start: \"a\"", 1),
            ("start: a\na: \"x\"", 2),
            ("start: (\"a\" | (\"b\" \"c\"))", 3),
            // Continuation lines belong to the rule; a cycle counts its members once.
            ("start: a\n  | b\na: b \"x\"\nb: a | \"y\"", 3),
            // Names inside strings, regexes, comments and special tokens are not references.
            ("start: \"a\" /a(b)c/ <[1-5]> // a\na: start", 2),
            ("start: A\nA: B \"x\"\nB: /[0-9]+/", 3),
            // Priorities and attributes do not hide a definition.
            ("start: a\na.2: b\nb[stop=\"\"]: /x/", 4),
            ("?start: expr\n!expr: \"1\"", 2),
            // %json schemas are kept for their own check; the rule weighs one level.
            ("start: %json {\"type\": \"object\"}", 1),
        ];
        for (g, want) in cases {
            assert_eq!(depth(g), *want, "{g:?}");
        }
        assert_eq!(shape("start: %json {\"$defs\": {}} | %json [1]").schemas.len(), 2);
    }

    #[test]
    fn chains_and_nesting_are_counted() {
        assert_eq!(depth(&chain(1000)), 1002);
        let nested = format!("start: {}\"a\"{}", "(".repeat(5000), ")".repeat(5000));
        assert_eq!(depth(&nested), 5001);
        // Mixed case splits names as llguidance's lexer does: `r1B` refers to `r1` and `B`.
        assert_eq!(depth("start: r1B\nr1: B\nB: \"x\""), 3);
    }

    #[test]
    fn nested_grammars_multiply() {
        let g = "start: a %lark { start: b\nb: \"x\" }\na: \"y\"";
        assert!(depth(g) >= 4, "{}", depth(g));
    }
}
