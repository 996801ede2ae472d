//! Measures the stack llguidance needs to compile constraints at the depth limit, so the compile
//! threads' stack ([`modelfleet_engine::constraint::workers::STACK_BYTES`]) is sized from a measurement,
//! not a guess.
//!
//! ```text
//! cargo run --release -p modelfleet-engine --example constraint_stack -- MODEL [CASE…]
//! ```
//!
//! For each case (default: all) it builds the deepest constraint of that shape the bound still
//! accepts ([`modelfleet_engine::constraint::MAX_COMPILE_DEPTH`]), then finds by bisection the smallest
//! thread stack (to 16 KiB) on which compiling it succeeds. A too-small stack aborts the process, so
//! every try runs in a child process (this program, re-run with `--try CASE KIB`). MODEL is a GGUF file
//! or a Hugging Face directory (its tokenizer builds the token trie), e.g. SmolLM2-135M-Instruct.
//! Prints one Markdown row per case: the shape, its measured depth, the stack it needed, and the
//! compile time.

use modelfleet_engine::ModelDir;
use modelfleet_engine::constraint::{
    ConstraintSpec, GrammarLimits, Grammars, MAX_COMPILE_DEPTH, compile_depth,
};
use serde_json::{Value, json};
use std::process::Command;

const CASES: [&str; 9] = [
    "lark-rules",
    "lark-tokens",
    "lark-brackets",
    "lark-rules-in-brackets",
    "json-refs",
    "json-refs-anyof",
    "json-refs-allof-siblings",
    "json-nesting",
    "lark-json-refs",
];

/// Rules r0 … r{n}, each referring to the next (the poison request of the issue, at size n).
fn lark_rules(n: usize, upper: bool, bracket: bool) -> String {
    let name = |i: usize| if upper { format!("T{i}") } else { format!("r{i}") };
    let mut g = format!("start: {}\n", name(0));
    for i in 0..n {
        if bracket {
            g.push_str(&format!("{}: ({} \"a\") | \"b\"\n", name(i), name(i + 1)));
        } else {
            g.push_str(&format!("{}: {} \"a\" | \"b\"\n", name(i), name(i + 1)));
        }
    }
    g.push_str(&format!("{}: \"c\"\n", name(n)));
    g
}

/// `$defs` d0 … d{n-1}, each reaching the next through `how`.
fn json_refs(n: usize, how: &str) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        let next = json!({"$ref": format!("#/$defs/d{}", i + 1)});
        let body = if i + 1 == n {
            json!({"type": "object", "properties": {"z": {"type": "integer"}}})
        } else {
            match how {
                "anyof" => json!({"anyOf": [next, {"type": "null"}]}),
                "allof" => {
                    json!({"type": "object", "allOf": [next], "properties": {"w": {"type": "integer"}}})
                }
                _ => json!({"type": "object", "properties": {"x": next}}),
            }
        };
        defs.insert(format!("d{i}"), body);
    }
    json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

fn json_nesting(n: usize) -> Value {
    let mut v = json!({"type": "integer"});
    for _ in 0..n {
        v = json!({"type": "object", "properties": {"x": v}, "required": ["x"]});
    }
    v
}

/// The spec of `case` at size `n`.
fn spec(case: &str, n: usize) -> ConstraintSpec {
    match case {
        "lark-rules" => ConstraintSpec::Lark(lark_rules(n, false, false)),
        "lark-tokens" => ConstraintSpec::Lark(lark_rules(n, true, false)),
        "lark-rules-in-brackets" => ConstraintSpec::Lark(lark_rules(n, false, true)),
        "lark-brackets" => ConstraintSpec::Lark(format!("start: {}\"a\"{}\n", "(".repeat(n), ")".repeat(n))),
        "json-refs" => ConstraintSpec::JsonSchema(json_refs(n, "properties")),
        "json-refs-anyof" => ConstraintSpec::JsonSchema(json_refs(n, "anyof")),
        "json-refs-allof-siblings" => ConstraintSpec::JsonSchema(json_refs(n, "allof")),
        "json-nesting" => ConstraintSpec::JsonSchema(json_nesting(n)),
        "lark-json-refs" => {
            ConstraintSpec::Lark(format!("start: \"x\" %json {}\n", json_refs(n, "properties")))
        }
        other => panic!("unknown case {other}"),
    }
}

/// The largest size of `case` whose depth is within the limit (JSON nesting stops at serde's 128).
fn at_limit(case: &str) -> usize {
    let cap = if case == "json-nesting" { 60 } else { 100_000 };
    let (mut lo, mut hi) = (1usize, cap);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if compile_depth(&spec(case, mid)) <= MAX_COMPILE_DEPTH {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

fn grammars(model: &str) -> Grammars {
    let md = ModelDir::open(std::path::Path::new(model)).expect("model");
    Grammars::new(
        &md.tokenizer,
        md.config.vocab_size,
        &md.eos_token_ids,
        GrammarLimits::default(),
    )
    .expect("grammars")
}

/// Child: compile `case` at the limit on a thread of `kib` KiB; exit 0 if it compiled, 3 if refused.
fn try_once(model: &str, case: &str, kib: usize) -> ! {
    let g = grammars(model);
    let s = spec(case, at_limit(case));
    let t = std::thread::Builder::new()
        .stack_size(kib << 10)
        .spawn(move || g.time_compile(&s).map_err(|e| e.to_string()))
        .expect("thread");
    match t.join().expect("join") {
        Ok(d) => {
            println!("{}", d.as_secs_f64());
            std::process::exit(0)
        }
        Err(e) => {
            println!("refused: {e}");
            std::process::exit(3)
        }
    }
}

fn compiles(model: &str, case: &str, kib: usize) -> Option<(bool, String)> {
    let out = Command::new(std::env::current_exe().ok()?)
        .args([model, "--try", case, &kib.to_string()])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    match out.status.code() {
        Some(0) => Some((true, text)),
        Some(3) => Some((true, text)),
        _ => Some((false, text)),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args.first().expect("MODEL").clone();
    if args.get(1).map(String::as_str) == Some("--try") {
        try_once(&model, &args[2], args[3].parse().expect("KIB"));
    }
    let cases: Vec<String> = if args.len() > 1 {
        args[1..].to_vec()
    } else {
        CASES.iter().map(|s| s.to_string()).collect()
    };
    println!("| case | size | depth (limit {MAX_COMPILE_DEPTH}) | stack needed | compile s |");
    println!("|---|---|---|---|---|");
    for case in cases {
        let n = at_limit(&case);
        let depth = compile_depth(&spec(&case, n));
        let (mut lo, mut hi) = (16usize, 256 << 10);
        if let Some((true, mut outcome)) = compiles(&model, &case, hi) {
            while hi - lo > 16 {
                let mid = (lo + hi) / 2;
                match compiles(&model, &case, mid) {
                    Some((true, t)) => {
                        hi = mid;
                        outcome = t;
                    }
                    _ => lo = mid,
                }
            }
            println!("| {case} | {n} | {depth} | {hi} KiB | {outcome} |");
        } else {
            println!("| {case} | {n} | {depth} | over 256 MiB | - |");
        }
    }
}
