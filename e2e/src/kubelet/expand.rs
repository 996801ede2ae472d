//! `$(VAR)` expansion of container commands, args and env values, as Kubernetes does it.
//!
//! Port of `third_party/forked/golang/expansion` from Kubernetes: `$(NAME)` is replaced by the value
//! of `NAME` when it is defined and left as written when it is not; `$$` is an escaped `$` (so
//! `$$(NAME)` yields the literal `$(NAME)`); an unterminated `$(` and any other `$x` are copied
//! unchanged. Invariant: the function works on bytes but only splits at ASCII `$`, `(` and `)`, so
//! the output of valid UTF-8 input is valid UTF-8.

/// Expands every `$(NAME)` in `input` with `lookup(NAME)`.
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let bytes = input.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(bytes.len());
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < bytes.len() {
        if bytes[cursor] == b'$' && cursor + 1 < bytes.len() {
            out.extend_from_slice(&bytes[checkpoint..cursor]);
            let rest = &bytes[cursor + 1..];
            let advance = match rest[0] {
                b'$' => {
                    out.push(b'$');
                    1
                }
                b'(' => match rest.iter().position(|&b| b == b')') {
                    Some(close) => {
                        let name = &input[cursor + 2..cursor + 1 + close];
                        match lookup(name) {
                            Some(value) => out.extend_from_slice(value.as_bytes()),
                            None => out.extend_from_slice(format!("$({name})").as_bytes()),
                        }
                        close + 1
                    }
                    None => {
                        out.extend_from_slice(b"$(");
                        1
                    }
                },
                other => {
                    out.push(b'$');
                    out.push(other);
                    1
                }
            };
            cursor += advance;
            checkpoint = cursor + 1;
        }
        cursor += 1;
    }
    out.extend_from_slice(&bytes[checkpoint.min(bytes.len())..]);
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::expand;

    fn check(input: &str, expected: &str) {
        let lookup = |name: &str| match name {
            "VAR_A" => Some("A".to_string()),
            "VAR_B" => Some("B".to_string()),
            "EMPTY" => Some(String::new()),
            "POD" => Some("póд".to_string()),
            _ => None,
        };
        assert_eq!(expand(input, lookup), expected, "input {input:?}");
    }

    #[test]
    fn expansion_follows_kubernetes() {
        check("", "");
        check("plain", "plain");
        check("$(VAR_A)", "A");
        check("x$(VAR_A)y$(VAR_B)z", "xAyBz");
        check("$(EMPTY)", "");
        check("$(UNDEFINED)", "$(UNDEFINED)");
        check("$$(VAR_A)", "$(VAR_A)");
        check("$$$(VAR_A)", "$A");
        check("$$$$(VAR_A)", "$$(VAR_A)");
        check("$(VAR_A", "$(VAR_A");
        check("$(", "$(");
        check("$", "$");
        check("a$", "a$");
        check("$x$(VAR_B)", "$xB");
        check("$VAR_A", "$VAR_A");
        check("($(VAR_A))", "(A)");
        check("$()", "$()");
        check("/p/$(POD)/é", "/p/póд/é");
        check("é$é", "é$é");
        check("--model=$(VAR_A)/$(VAR_B)", "--model=A/B");
    }
}
