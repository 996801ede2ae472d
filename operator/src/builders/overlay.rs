//! Strategic merge of a pod-template patch into a pod template, both as JSON (pure, table-tested) —
//! the semantics of `kubectl patch --type strategic` for the fields a pod template has:
//! - objects merge key by key, recursively; a `null` in the patch removes the key;
//! - lists with a merge key merge element by element: `containers`, `initContainers`,
//!   `ephemeralContainers`, `volumes`, `imagePullSecrets`, `resourceClaims`, `schedulingGates` and a
//!   container's `env` by `name`, a container's `ports` by `containerPort`, `volumeMounts` by
//!   `mountPath`, `volumeDevices` by `devicePath`, `resizePolicy` by `resourceName`, `hostAliases` by
//!   `ip`, `topologySpreadConstraints` by `topologyKey`; an element whose key is already there merges
//!   into it (in place), the others are appended in the patch's order;
//! - every other list (`tolerations`, `args`, `command`, `envFrom`, …) and every scalar replaces.
//!
//! Invariants: the merge never reorders what the base has; a directive (`$patch`, `$retainKeys`,
//! `$setElementOrder/…`, `$deleteFromPrimitiveList/…`) or an element without its merge key is an error
//! naming the field, never a silent guess.

use serde_json::{Map, Value};

/// A patch the merge cannot apply, with the field it is about (`spec.containers[1]`, …).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergeError {
    /// Where, from the template's root.
    pub field: String,
    /// Why.
    pub message: String,
}

impl std::fmt::Display for MergeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// What kind of object is being merged: it decides the merge keys of its lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Template,
    PodSpec,
    Container,
    Other,
}

/// The merge key of list `field` inside an object of `kind`, and the kind of its elements.
fn list_key(kind: Kind, field: &str) -> Option<(&'static str, Kind)> {
    match (kind, field) {
        (Kind::PodSpec, "containers" | "initContainers" | "ephemeralContainers") => {
            Some(("name", Kind::Container))
        }
        (Kind::PodSpec, "volumes" | "imagePullSecrets" | "resourceClaims" | "schedulingGates") => {
            Some(("name", Kind::Other))
        }
        (Kind::PodSpec, "hostAliases") => Some(("ip", Kind::Other)),
        (Kind::PodSpec, "topologySpreadConstraints") => Some(("topologyKey", Kind::Other)),
        (Kind::Container, "env") => Some(("name", Kind::Other)),
        (Kind::Container, "ports") => Some(("containerPort", Kind::Other)),
        (Kind::Container, "volumeMounts") => Some(("mountPath", Kind::Other)),
        (Kind::Container, "volumeDevices") => Some(("devicePath", Kind::Other)),
        (Kind::Container, "resizePolicy") => Some(("resourceName", Kind::Other)),
        _ => None,
    }
}

/// The kind of object field `field` of a `kind` object holds.
fn child_kind(kind: Kind, field: &str) -> Kind {
    match (kind, field) {
        (Kind::Template, "spec") => Kind::PodSpec,
        _ => Kind::Other,
    }
}

/// Merges `patch` (a pod template: `metadata`, `spec`) into `base`.
pub fn merge_template(base: &mut Value, patch: &Value) -> Result<(), MergeError> {
    merge_value(base, patch, Kind::Template, "")
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn merge_value(base: &mut Value, patch: &Value, kind: Kind, path: &str) -> Result<(), MergeError> {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => merge_object(b, p, kind, path),
        (b, p) => {
            refuse_directives(p, path)?;
            *b = p.clone();
            Ok(())
        }
    }
}

fn merge_object(
    base: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    kind: Kind,
    path: &str,
) -> Result<(), MergeError> {
    for (key, value) in patch {
        let here = join(path, key);
        if key.starts_with('$') {
            return Err(directive(&here));
        }
        if value.is_null() {
            base.remove(key);
            continue;
        }
        let merged = match (list_key(kind, key), base.get_mut(key), value) {
            (Some((merge_key, element)), Some(Value::Array(b)), Value::Array(p)) => {
                merge_list(b, p, (merge_key, element), &here)
            }
            (Some((merge_key, _)), _, Value::Array(p)) => {
                check_keys(p, merge_key, &here)?;
                refuse_directives(value, &here)?;
                base.insert(key.clone(), value.clone());
                Ok(())
            }
            (_, Some(b), _) => merge_value(b, value, child_kind(kind, key), &here),
            (_, None, _) => {
                refuse_directives(value, &here)?;
                base.insert(key.clone(), value.clone());
                Ok(())
            }
        };
        merged?;
    }
    Ok(())
}

/// Merges list `patch` into `base` by `key`: elements with a key already in `base` merge into it in
/// place, the rest are appended in the patch's order.
fn merge_list(
    base: &mut Vec<Value>,
    patch: &[Value],
    (key, kind): (&str, Kind),
    path: &str,
) -> Result<(), MergeError> {
    check_keys(patch, key, path)?;
    for (i, p) in patch.iter().enumerate() {
        let here = format!("{path}[{i}]");
        let id = &p[key];
        match base.iter_mut().find(|b| &b[key] == id) {
            Some(b) => merge_value(b, p, kind, &here)?,
            None => {
                refuse_directives(p, &here)?;
                base.push(p.clone());
            }
        }
    }
    Ok(())
}

/// Every element of a merged list is an object with its merge key.
fn check_keys(list: &[Value], key: &str, path: &str) -> Result<(), MergeError> {
    for (i, v) in list.iter().enumerate() {
        if v.get(key).is_none_or(Value::is_null) {
            return Err(MergeError {
                field: format!("{path}[{i}]"),
                message: format!("an element of a list merged by {key} needs its {key}"),
            });
        }
    }
    Ok(())
}

/// An error for every strategic-merge directive inside `v`.
fn refuse_directives(v: &Value, path: &str) -> Result<(), MergeError> {
    match v {
        Value::Object(o) => {
            for (k, v) in o {
                let here = join(path, k);
                if k.starts_with('$') {
                    return Err(directive(&here));
                }
                refuse_directives(v, &here)?;
            }
            Ok(())
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                refuse_directives(v, &format!("{path}[{i}]"))?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn directive(field: &str) -> MergeError {
    MergeError {
        field: field.to_string(),
        message: "strategic merge directives ($patch, $retainKeys, $setElementOrder, \
                  $deleteFromPrimitiveList) are not supported: set the field, or null to remove a key"
            .into(),
    }
}

#[cfg(test)]
mod tests;
