//! The depth llguidance's JSON-schema compiler can reach on a schema: its nesting plus every `$ref`
//! it follows, measured without recursion.
//!
//! The compiler walks a schema by recursion and resolves each `$ref` (once per target, memoized) by
//! compiling the target in place, so a chain of `$defs` each referring to the next is as deep as the
//! chain. Here every `$ref` target is a node weighing one level plus its own nesting, with an edge to
//! each target referred to inside it; the depth is the longest path ([`super::graph::DepthGraph`]) from
//! the root. References resolve as the compiler resolves local ones: `#`, JSON pointers `#/…` (with
//! `~0`, `~1` and percent escapes), and the document's `$anchor`s and `$id`s. Keys are read by position:
//! in a schema they are keywords, under `properties`, `$defs` and the like they are names (a property
//! may be called `$ref` or `const`), and data (`const`, `enum`, `default`, `examples`) holds no
//! references. A reference this cannot resolve — unknown, named twice, or inside a resource with its
//! own `$id` (resolved against that resource's base) — makes the bound the crude one: every distinct
//! reference on the stack at once, each at the document's full nesting.

use super::graph::DepthGraph;
use serde_json::Value;
use std::collections::{HashMap, HashSet};

/// Keywords whose values are data, not schemas.
const DATA: [&str; 4] = ["const", "enum", "default", "examples"];
/// Keywords whose values map names (any string, `$ref` included) to schemas.
const MAPS: [&str; 6] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];

/// Bound on the recursion levels of compiling `schema`.
pub(super) fn depth(schema: &Value) -> usize {
    let index = Index::of(schema);
    let mut graph = DepthGraph::default();
    let mut nodes: HashMap<*const Value, usize> = HashMap::new();
    let mut todo: Vec<&Value> = vec![schema];
    let mut unresolved = false;
    nodes.insert(schema as *const Value, graph.node(0));
    while let Some(target) = todo.pop() {
        let from = nodes[&(target as *const Value)];
        let found = walk(
            target,
            std::ptr::eq(target, schema),
            index.scoped.contains(&(target as *const Value)),
        );
        graph.raise(from, found.nesting + 1);
        unresolved |= found.scoped_refs;
        for r in found.refs {
            let Some(to) = index.resolve(schema, r) else {
                unresolved = true;
                continue;
            };
            let next = graph.len();
            let id = *nodes.entry(to as *const Value).or_insert(next);
            if id == next {
                graph.node(0);
                todo.push(to);
            }
            graph.edge(from, id);
        }
    }
    let bound = graph.longest_path_bound();
    if unresolved {
        let nesting = walk(schema, true, false).nesting;
        bound.max((index.distinct_refs + 1).saturating_mul(nesting + 1))
    } else {
        bound
    }
}

/// Where a value sits in a schema document.
#[derive(Clone, Copy, PartialEq)]
enum Pos {
    /// A schema: its keys are keywords.
    Schema,
    /// A keyword's map from names to schemas.
    Map,
    /// Data (`const`, `enum`, …): no keywords inside.
    Data,
}

/// What a walk under one value found.
struct Found<'a> {
    /// The deepest nesting under it (0 for a scalar).
    nesting: usize,
    /// The `$ref` strings in schema positions, outside resources with their own `$id`.
    refs: Vec<&'a str>,
    /// Whether a `$ref` sits inside a resource with its own `$id` (resolved against that resource's
    /// base, which this does not model).
    scoped_refs: bool,
}

/// Walks `v` as a schema; `is_root` when it is the document (whose own `$id` is the base), `scoped`
/// when `v` lies inside a resource with its own `$id`.
fn walk(v: &Value, is_root: bool, scoped: bool) -> Found<'_> {
    let mut found = Found {
        nesting: 0,
        refs: Vec::new(),
        scoped_refs: false,
    };
    // (value, depth, position, inside a resource with its own `$id`)
    let mut stack: Vec<(&Value, usize, Pos, bool)> = vec![(v, 0, Pos::Schema, scoped)];
    while let Some((v, d, pos, scoped)) = stack.pop() {
        found.nesting = found.nesting.max(d);
        match (v, pos) {
            (Value::Object(map), Pos::Schema) => {
                let scoped = scoped || (map.contains_key("$id") && !(is_root && d == 0));
                for (k, child) in map {
                    let k = k.as_str();
                    if let ("$ref", Value::String(r)) = (k, child) {
                        if scoped {
                            found.scoped_refs = true;
                        } else {
                            found.refs.push(r);
                        }
                        continue;
                    }
                    let pos = if DATA.contains(&k) {
                        Pos::Data
                    } else if MAPS.contains(&k) {
                        Pos::Map
                    } else {
                        Pos::Schema
                    };
                    stack.push((child, d + 1, pos, scoped));
                }
            }
            (Value::Object(map), Pos::Map) => {
                stack.extend(map.values().map(|c| (c, d + 1, Pos::Schema, scoped)));
            }
            (Value::Object(map), Pos::Data) => {
                stack.extend(map.values().map(|c| (c, d + 1, Pos::Data, scoped)));
            }
            (Value::Array(items), _) => stack.extend(items.iter().map(|c| (c, d + 1, pos, scoped))),
            _ => {}
        }
    }
    found
}

/// The document's `$id`s and `$anchor`s in schema positions (a name given twice resolves to neither),
/// the values inside resources with their own `$id`, and how many distinct references it makes.
struct Index<'a> {
    ids: HashMap<&'a str, Option<&'a Value>>,
    anchors: HashMap<&'a str, Option<&'a Value>>,
    scoped: HashSet<*const Value>,
    distinct_refs: usize,
}

impl<'a> Index<'a> {
    fn of(root: &'a Value) -> Self {
        let mut index = Index {
            ids: HashMap::new(),
            anchors: HashMap::new(),
            scoped: HashSet::new(),
            distinct_refs: 0,
        };
        let mut refs = HashSet::new();
        // (value, position, inside a resource with its own `$id`)
        let mut stack = vec![(root, Pos::Schema, false)];
        let named = |names: &mut HashMap<&'a str, Option<&'a Value>>, name: &'a str, v: &'a Value| {
            names
                .entry(name)
                .and_modify(|seen| *seen = None)
                .or_insert(Some(v));
        };
        while let Some((v, pos, scoped)) = stack.pop() {
            let scoped = scoped
                || (pos == Pos::Schema
                    && !std::ptr::eq(v, root)
                    && v.as_object().is_some_and(|m| m.contains_key("$id")));
            if scoped {
                index.scoped.insert(v as *const Value);
            }
            match (v, pos) {
                (Value::Object(map), Pos::Schema) => {
                    if let Some(Value::String(id)) = map.get("$id") {
                        named(&mut index.ids, id.trim_end_matches('#'), v);
                    }
                    if let Some(Value::String(a)) = map.get("$anchor") {
                        named(&mut index.anchors, a, v);
                    }
                    if let Some(Value::String(r)) = map.get("$ref") {
                        refs.insert(r.as_str());
                    }
                    for (k, child) in map {
                        let k = k.as_str();
                        if DATA.contains(&k) {
                            continue;
                        }
                        let pos = if MAPS.contains(&k) { Pos::Map } else { Pos::Schema };
                        stack.push((child, pos, scoped));
                    }
                }
                (Value::Object(map), Pos::Map) => {
                    stack.extend(map.values().map(|c| (c, Pos::Schema, scoped)))
                }
                (Value::Array(items), _) => stack.extend(items.iter().map(|c| (c, pos, scoped))),
                _ => {}
            }
        }
        index.distinct_refs = refs.len();
        index
    }

    /// The value `reference` names in the document rooted at `root`.
    fn resolve(&self, root: &'a Value, reference: &str) -> Option<&'a Value> {
        let (base, fragment) = reference.split_once('#').unwrap_or((reference, ""));
        let doc = if base.is_empty() {
            root
        } else {
            (*self.ids.get(base)?)?
        };
        if fragment.is_empty() {
            return Some(doc);
        }
        if !fragment.starts_with('/') {
            return *self.anchors.get(fragment)?;
        }
        doc.pointer(&percent_decode(fragment)?)
    }
}

/// A URI fragment's `%XX` escapes decoded (JSON pointer escapes are left to `Value::pointer`).
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `$defs` d0 … d{n-1}, each referring to the next, the last a string.
    pub(crate) fn ref_chain(n: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            let body = if i + 1 < n {
                json!({"type": "object", "properties": {"x": {"$ref": format!("#/$defs/d{}", i + 1)}}})
            } else {
                json!({"type": "string"})
            };
            defs.insert(format!("d{i}"), body);
        }
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    #[test]
    fn depths_of_small_schemas() {
        let cases = [
            (json!({"type": "string"}), 2),
            (
                json!({"type": "object", "properties": {"a": {"type": "integer"}}}),
                4,
            ),
            // A self reference counts once.
            (json!({"type": "array", "items": {"$ref": "#"}}), 2),
            // `$ref` inside data is not a reference.
            (json!({"const": {"$ref": "#/nowhere"}}), 3),
        ];
        for (schema, want) in cases {
            assert_eq!(depth(&schema), want, "{schema}");
        }
    }

    #[test]
    fn ref_chains_add_up() {
        let short = depth(&ref_chain(2));
        let long = depth(&ref_chain(500));
        assert!(long >= 500 * 3, "{short} {long}");
        // The same chain through anchors, ids and escaped pointers.
        let anchored = json!({
            "$defs": {
                "a/b": {"$anchor": "first", "properties": {"x": {"$ref": "other#/$defs/c"}}},
                "holder": {"$id": "other", "$defs": {"c": {"properties": {"y": {"$ref": "#first"}}}}}
            },
            "$ref": "#/$defs/a~1b"
        });
        assert!(depth(&anchored) >= 2 * 3, "{}", depth(&anchored));
    }

    #[test]
    fn keys_are_read_by_position() {
        // Properties named like keywords hold schemas; their references count.
        let named = json!({"properties": {"$ref": {"$ref": "#/$defs/a"}, "const": {"$ref": "#/$defs/a"}},
                           "$defs": {"a": {"properties": {"x": {"properties": {"y": {}}}}}}});
        assert!(depth(&named) >= 4 + 5, "{}", depth(&named));
        // A reference into a resource with its own `$id` is resolved against that resource: crude.
        let scoped = json!({"$defs": {"r": {"$id": "r", "$defs": {"n": {"$ref": "#/$defs/m"}}}},
                            "$ref": "r#/$defs/n"});
        let crude = depth(&scoped);
        assert!(crude >= 3 * 5, "{crude}");
    }

    #[test]
    fn unresolved_references_take_the_crude_bound() {
        let s =
            json!({"properties": {"a": {"$ref": "https://example.com/x"}, "b": {"$ref": "#/$defs/missing"}}});
        assert_eq!(depth(&s), 3 * 3);
    }
}
