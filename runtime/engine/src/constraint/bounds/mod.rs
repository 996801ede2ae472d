//! Bounds on the structure a request hands the grammar compiler, measured before llguidance sees it.
//!
//! llguidance compiles Lark rules, token definitions and bracketed groups, and JSON schemas through
//! their `$ref`s, by recursion. A chain of a thousand rules, or of five hundred `$defs` each referring
//! to the next, needs more stack than any thread has, and a stack overflow aborts the whole process
//! (every request on the pod with it). So each constraint's depth — an upper bound on that recursion,
//! measured here without recursing — is refused past [`MAX_COMPILE_DEPTH`] with a reason naming the
//! limit, and the compile threads' stack is sized (measured) for that depth ([`super::workers`]).
//!
//! Regexes need no bound here: `regex-syntax` parses them with an explicit stack and a nesting limit,
//! and llguidance's regex compiler (`derivre`) is iterative; what they cost is bounded by lexer fuel.

mod graph;
mod json;
mod lark;

use super::spec::ConstraintSpec;
use crate::error::{EngineError, Result};
use serde_json::Value;

/// Most levels of recursion a constraint may need to compile: for a grammar, rules and tokens referring
/// to one another plus the brackets inside each; for a schema, its nesting plus every `$ref` it
/// follows (docs/api.md, "Structured output limits").
pub const MAX_COMPILE_DEPTH: usize = 2048;

/// The bound on the recursion levels compiling `spec` needs: the larger of a grammar's own and its
/// `%json` schemas' (benchmarks and tests measure at the limit with it).
pub fn depth(spec: &ConstraintSpec) -> usize {
    match spec {
        ConstraintSpec::JsonSchema(schema) => json::depth(schema),
        ConstraintSpec::Lark(grammar) => {
            let shape = lark::shape(grammar);
            shape
                .schemas
                .iter()
                .map(json::depth)
                .fold(shape.depth, usize::max)
        }
        ConstraintSpec::JsonObject | ConstraintSpec::Regex(_) | ConstraintSpec::Choice(_) => 1,
    }
}

/// Refuses `spec` when compiling it could recurse deeper than [`MAX_COMPILE_DEPTH`].
pub fn check(spec: &ConstraintSpec) -> Result<()> {
    match spec {
        ConstraintSpec::JsonSchema(schema) => check_schema(schema, "the schema"),
        ConstraintSpec::Lark(grammar) => {
            let shape = lark::shape(grammar);
            if shape.depth > MAX_COMPILE_DEPTH {
                return Err(EngineError::Constraint(format!(
                    "the grammar nests {} levels deep (rules and tokens referring to one another, and the \
                     brackets inside them); at most {MAX_COMPILE_DEPTH} are accepted",
                    shape.depth
                )));
            }
            shape
                .schemas
                .iter()
                .try_for_each(|s| check_schema(s, "a `%json` schema in the grammar"))
        }
        ConstraintSpec::JsonObject | ConstraintSpec::Regex(_) | ConstraintSpec::Choice(_) => Ok(()),
    }
}

fn check_schema(schema: &Value, what: &str) -> Result<()> {
    let depth = json::depth(schema);
    if depth > MAX_COMPILE_DEPTH {
        return Err(EngineError::Constraint(format!(
            "{what} nests {depth} levels deep (its objects and arrays, plus every `$ref` it follows); at \
             most {MAX_COMPILE_DEPTH} are accepted"
        )));
    }
    Ok(())
}
