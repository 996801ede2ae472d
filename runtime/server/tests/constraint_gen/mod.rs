//! Hostile structured-output constraints, built by structure: Lark grammars (rule and token chains,
//! reference cycles, nested brackets, regex literals, `%json` schemas, nested `%lark` blocks), JSON
//! schemas (`$defs`/`$ref` chains through `properties`, `anyOf`, `allOf` with siblings, anchors and
//! ids, deep nesting, patterns, huge bounds), regexes (nested counted repetition, groups, classes,
//! unsupported syntax) and tool lists, each sometimes mutated byte by byte. Shared by the poison test
//! (the named families) and the fuzzer (random draws from a seed).

#![allow(dead_code)]

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value, json};

/// Rules r0 … r{n}, each referring to the next: `r{i}: r{i+1} "a" | "b"`.
pub fn lark_rule_chain(n: usize) -> String {
    let mut g = String::from("start: r0\n");
    for i in 0..n {
        g.push_str(&format!("r{i}: r{} \"a\" | \"b\"\n", i + 1));
    }
    g.push_str(&format!("r{n}: \"c\"\n"));
    g
}

/// Tokens T0 … T{n}, each referring to the next.
pub fn lark_token_chain(n: usize) -> String {
    let mut g = String::from("start: T0\n");
    for i in 0..n {
        g.push_str(&format!("T{i}: T{} \"a\" | \"b\"\n", i + 1));
    }
    g.push_str(&format!("T{n}: \"c\"\n"));
    g
}

/// `start: ((…("a")…))` nested `n` deep.
pub fn lark_brackets(n: usize) -> String {
    format!("start: {}\"a\"{}\n", "(".repeat(n), ")".repeat(n))
}

/// `$defs` d0 … d{n-1}, each reaching the next through `how` (`properties`, `anyOf`, `allOf`, `items`).
pub fn ref_chain(n: usize, how: &str) -> Value {
    let mut defs = Map::new();
    for i in 0..n {
        let next = json!({"$ref": format!("#/$defs/d{}", i + 1)});
        let body = if i + 1 == n {
            json!({"type": "object", "properties": {"z": {"type": "integer"}}})
        } else {
            match how {
                "anyOf" => json!({"anyOf": [next, {"type": "null"}]}),
                "allOf" => {
                    json!({"type": "object", "allOf": [next], "properties": {"w": {"type": "integer"}}})
                }
                "items" => json!({"type": "array", "items": next, "maxItems": 2}),
                _ => json!({"type": "object", "properties": {"x": next}}),
            }
        };
        defs.insert(format!("d{i}"), body);
    }
    json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

/// Objects nested `n` deep through `properties`.
pub fn nested_schema(n: usize) -> Value {
    let mut v = json!({"type": "integer"});
    for _ in 0..n {
        v = json!({"type": "object", "properties": {"x": v}, "required": ["x"]});
    }
    v
}

/// A tool list whose one function's parameters are `schema`.
pub fn tools_with(schema: Value) -> Value {
    json!([{"type": "function", "function": {"name": "f", "description": "d", "parameters": schema}}])
}

/// Draws hostile constraints from a seed.
pub struct Gen {
    rng: ChaCha8Rng,
}

/// One generated request: its path and body.
pub struct Drawn {
    pub path: &'static str,
    pub body: Value,
    /// What was drawn, for the failure report.
    pub what: &'static str,
}

impl Gen {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    fn size(&mut self, big: usize) -> usize {
        // Mostly small, sometimes up to `big` (the sizes where limits live).
        match self.rng.random_range(0..10) {
            0..=5 => self.rng.random_range(0..8),
            6..=7 => self.rng.random_range(0..64),
            _ => self.rng.random_range(0..=big),
        }
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.rng.random_range(0..xs.len())]
    }

    /// A request carrying one drawn constraint.
    pub fn request(&mut self, model: &str) -> Drawn {
        let kind = self.rng.random_range(0..9);
        let (what, field, value): (&'static str, &str, Value) = match kind {
            0 | 1 => ("lark", "grammar", Value::from(self.lark())),
            2 | 3 => ("schema", "json", self.schema_doc()),
            4 => ("regex", "regex", Value::from(self.regex(0))),
            5 => ("choice", "choice", self.choice()),
            6 => ("response_format", "", Value::Null),
            _ => ("tools", "", Value::Null),
        };
        let mut body = json!({"model": model, "max_tokens": 2, "temperature": 0});
        match what {
            "response_format" => {
                body["messages"] = json!([{"role": "user", "content": "hi"}]);
                body["response_format"] =
                    json!({"type": "json_schema", "json_schema": {"name": "s", "schema": self.schema_doc()}});
                return Drawn {
                    path: "/v1/chat/completions",
                    body,
                    what,
                };
            }
            "tools" => {
                body["messages"] = json!([{"role": "user", "content": "hi"}]);
                let n = self.rng.random_range(1..=4);
                let tools: Vec<Value> = (0..n)
                    .map(|i| {
                        json!({"type": "function", "function": {
                            "name": format!("f{i}"), "parameters": self.schema_doc()}})
                    })
                    .collect();
                body["tools"] = Value::from(tools);
                body["tool_choice"] = Value::from(*self.pick(&["auto", "required"]));
                return Drawn {
                    path: "/v1/chat/completions",
                    body,
                    what,
                };
            }
            _ => {}
        }
        body["prompt"] = Value::from("x");
        // The same constraint through vLLM's older top-level fields, sometimes.
        let legacy = match field {
            "json" => Some("guided_json"),
            "regex" => Some("guided_regex"),
            "grammar" => Some("guided_grammar"),
            "choice" => Some("guided_choice"),
            _ => None,
        };
        match legacy.filter(|_| self.rng.random_bool(0.3)) {
            Some(name) => body[name] = value,
            None => body["structured_outputs"] = json!({ field: value }),
        }
        Drawn {
            path: "/v1/completions",
            body,
            what,
        }
    }

    fn choice(&mut self) -> Value {
        let n = self.size(300);
        Value::from((0..n).map(|i| format!("c{i}")).collect::<Vec<_>>())
    }

    /// A Lark grammar: a skeleton of rules and tokens referring to one another, then perhaps mutated.
    pub fn lark(&mut self) -> String {
        let rules = self.size(3000).max(1);
        let shape = self.rng.random_range(0..4);
        let mut g = String::from("start: r0\n");
        for i in 0..rules {
            let upper = self.rng.random_bool(0.2);
            let name = if upper { format!("T{i}") } else { format!("r{i}") };
            if upper && i == 0 {
                g = String::from("start: T0\n");
            }
            let mut body = Vec::new();
            let alts = self.rng.random_range(1..4);
            for _ in 0..alts {
                let mut seq = Vec::new();
                for _ in 0..self.rng.random_range(1..4) {
                    seq.push(self.lark_atom(i, rules, shape, upper));
                }
                body.push(seq.join(" "));
            }
            let open = self.size(20);
            let line = format!(
                "{name}{}: {}{}{}\n",
                if self.rng.random_bool(0.05) {
                    "[stop=\"\"]"
                } else {
                    ""
                },
                "(".repeat(open),
                body.join(" | "),
                ")".repeat(open)
            );
            g.push_str(&line);
        }
        if self.rng.random_bool(0.1) {
            g.push_str(&format!("%ignore /{}/\n", self.regex(0)));
        }
        if self.rng.random_bool(0.05) {
            let inner = self.lark();
            g = g.replacen("start: ", &format!("start: %lark {{\n{inner}\n}} | "), 1);
        }
        self.mutate(g)
    }

    fn lark_atom(&mut self, i: usize, rules: usize, shape: u32, upper: bool) -> String {
        let next = i + 1;
        let target = match shape {
            // A chain.
            0 => next,
            // Anywhere (cycles).
            1 => self.rng.random_range(0..rules + 1),
            // Backwards only (a DAG).
            2 => self.rng.random_range(0..=i),
            _ => next.min(rules),
        };
        let name = |t: usize, up: bool| if up { format!("T{t}") } else { format!("r{t}") };
        match self.rng.random_range(0..12) {
            0..=4 if target < rules => {
                // Tokens may only refer to tokens; rules to either.
                let up = if upper { true } else { self.rng.random_bool(0.2) };
                name(target, up)
            }
            5 => format!("/{}/", self.regex(0)),
            6 if self.rng.random_bool(0.02) => format!("%json {}", self.schema_doc()),
            7 => format!("\"{}\"{}", self.pick(&["a", "b", "{", "\\\"", "ü"]), self.op()),
            8 => format!("({} | \"q\"){}", name(target.min(rules), upper), self.op()),
            9 => "\"x\"~2..5".into(),
            10 => format!(
                "<[{}-{}]>",
                self.rng.random_range(0..100),
                self.rng.random_range(100..200)
            ),
            _ => "\"c\"".into(),
        }
    }

    fn op(&mut self) -> &'static str {
        const OPS: [&str; 7] = ["", "", "*", "+", "?", "{2,9}", "{0,1000}"];
        OPS[self.rng.random_range(0..OPS.len())]
    }

    /// A regular expression; nested counted repetition is the expensive family.
    pub fn regex(&mut self, depth: usize) -> String {
        if depth > 6 {
            return "a".into();
        }
        match self.rng.random_range(0..12) {
            0 | 1 => format!(
                "({}){{{}}}",
                self.regex(depth + 1),
                self.rng.random_range(0..2000)
            ),
            2 => format!(
                "({}){{{},{}}}",
                self.regex(depth + 1),
                self.rng.random_range(0..50),
                self.rng.random_range(50..3000)
            ),
            3 => format!("{}|{}", self.regex(depth + 1), self.regex(depth + 1)),
            4 => format!("{}{}", self.regex(depth + 1), self.regex(depth + 1)),
            5 => format!(
                "[{}-{}]+",
                self.pick(&["a", "0", "A"]),
                self.pick(&["z", "9", "Z"])
            ),
            6 => format!("({})*", self.regex(depth + 1)),
            7 => "\\p{L}{1,64}".into(),
            8 => "(?i)abc".into(),
            9 => format!("{}{}", "(".repeat(self.size(400)), "a"),
            10 => "(a)\\1".into(),
            _ => self.pick(&["a", "b+", ".", "\\d", "[^x]"]).to_string(),
        }
    }

    /// A schema document: a body, often with `$defs` its references reach.
    pub fn schema_doc(&mut self) -> Value {
        let n_defs = self.size(1200);
        let mut defs = Map::new();
        for i in 0..n_defs {
            let s = self.schema(0, n_defs);
            defs.insert(format!("d{i}"), s);
        }
        let mut root = match self.rng.random_range(0..3) {
            0 if n_defs > 0 => json!({"$ref": "#/$defs/d0"}),
            _ => self.schema(0, n_defs),
        };
        if n_defs > 0 && root.is_object() {
            root["$defs"] = Value::Object(defs);
        }
        if self.rng.random_bool(0.05) {
            // Schema text instead of an object, sometimes broken.
            let text = root.to_string();
            return Value::from(self.mutate(text));
        }
        root
    }

    fn reference(&mut self, n_defs: usize) -> Value {
        if n_defs == 0 || self.rng.random_bool(0.1) {
            return json!({"$ref": *self.pick(&["#", "#/nowhere", "https://example.com/s", "#anchor"])});
        }
        json!({"$ref": format!("#/$defs/d{}", self.rng.random_range(0..n_defs))})
    }

    fn schema(&mut self, depth: usize, n_defs: usize) -> Value {
        if depth > 20 {
            return json!({"type": "string"});
        }
        match self.rng.random_range(0..14) {
            0 | 1 => self.reference(n_defs),
            2 => {
                let k = self.rng.random_range(1..4);
                let props: Map<String, Value> = (0..k)
                    .map(|i| (format!("p{i}"), self.schema(depth + 1, n_defs)))
                    .collect();
                json!({"type": "object", "properties": props, "additionalProperties": self.rng.random_bool(0.5)})
            }
            3 => json!({"anyOf": [self.schema(depth + 1, n_defs), self.schema(depth + 1, n_defs)]}),
            4 => json!({"allOf": [self.schema(depth + 1, n_defs)], "type": "object"}),
            5 => json!({"oneOf": [self.schema(depth + 1, n_defs), {"type": "null"}]}),
            6 => json!({"type": "array", "items": self.schema(depth + 1, n_defs),
                        "minItems": self.rng.random_range(0..3), "maxItems": self.rng.random_range(0..100_000)}),
            7 => json!({"type": "string", "pattern": self.regex(0)}),
            8 => json!({"type": "string", "minLength": self.rng.random_range(0..10),
                        "maxLength": self.rng.random_range(10..1_000_000)}),
            9 => json!({"type": "integer", "minimum": self.rng.random_range(-1000..0),
                        "maximum": self.rng.random_range(0..1_000_000_000i64)}),
            10 => json!({"enum": ["a", 1, null, {"$ref": "#"}]}),
            11 => json!({"$anchor": "anchor", "type": "boolean"}),
            12 => json!({"$id": "inner", "$defs": {"q": {"type": "string"}},
                         "properties": {"x": {"$ref": "#/$defs/q"}}}),
            _ => json!({"type": *self.pick(&["string", "number", "boolean", "null", "object"])}),
        }
    }

    /// Sometimes deletes, duplicates or inserts a byte run (keeps the text valid UTF-8).
    fn mutate(&mut self, text: String) -> String {
        if text.is_empty() || !self.rng.random_bool(0.15) {
            return text;
        }
        let mut chars: Vec<char> = text.chars().collect();
        for _ in 0..self.rng.random_range(1..4) {
            let at = self.rng.random_range(0..chars.len().max(1));
            match self.rng.random_range(0..3) {
                0 if !chars.is_empty() => {
                    chars.remove(at.min(chars.len() - 1));
                }
                1 => {
                    let c = *self.pick(&['(', ')', '[', ']', '{', '}', '"', '/', '|', ':', '\n', '%', '\\']);
                    for _ in 0..self.size(200).max(1) {
                        chars.insert(at.min(chars.len()), c);
                    }
                }
                _ => {
                    let end = (at + self.rng.random_range(1..40)).min(chars.len());
                    let run: Vec<char> = chars[at.min(end)..end].to_vec();
                    for (k, c) in run.into_iter().enumerate() {
                        chars.insert((end + k).min(chars.len()), c);
                    }
                }
            }
        }
        chars.into_iter().collect()
    }
}
