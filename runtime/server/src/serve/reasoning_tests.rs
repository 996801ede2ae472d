use super::*;

/// What a client sees of an answer: reasoning, content, calls (name, arguments), finish reason.
type Seen = (String, String, Vec<(String, String)>, String);

fn whole(start: Start, tools: bool, text: &str, reason: &str) -> Seen {
    let (m, reason) = answer(Some(start), tools, text, ("chatcmpl-x", 0), reason.into());
    let calls = m
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.function.name, c.function.arguments))
        .collect();
    let content = m.content.unwrap_or_default();
    (m.reasoning_content.unwrap_or_default(), content, calls, reason)
}

/// Streams `pieces` as the SSE writer does and reassembles the deltas as a client would.
fn streamed(start: Start, tools: bool, pieces: &[&str], reason: &str) -> Seen {
    let mut splitter = Splitter::new(start);
    let mut parser = tools.then(|| CallParser::new("call_x_0_"));
    let (mut reasoning, mut content, mut calls) =
        (String::new(), String::new(), Vec::<(String, String)>::new());
    let mut deltas = Vec::new();
    for p in pieces {
        deltas.push(stream_delta(Some(&mut splitter), parser.as_mut(), p, false));
    }
    deltas.push(stream_delta(Some(&mut splitter), parser.as_mut(), "", true));
    for d in deltas {
        assert!(
            d.reasoning_content.as_deref() != Some(""),
            "no empty reasoning deltas"
        );
        reasoning.push_str(d.reasoning_content.as_deref().unwrap_or(""));
        content.push_str(d.content.as_deref().unwrap_or(""));
        for t in d.tool_calls.unwrap_or_default() {
            if let Some(name) = t.function.name {
                calls.push((name, String::new()));
            }
            calls[t.index as usize]
                .1
                .push_str(t.function.arguments.as_deref().unwrap_or(""));
        }
    }
    let reason = tools::finish_reason(parser.as_ref(), reason.into());
    (reasoning, content, calls, reason)
}

/// The text answered whole, and streamed cut at every position, at every pair of positions and one
/// character at a time, all read the same; and that is `want`.
fn check(start: Start, tools: bool, text: &str, reason: &str, want: (&str, &str, &[(&str, &str)], &str)) {
    let want: Seen = (
        want.0.into(),
        want.1.into(),
        want.2
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
        want.3.into(),
    );
    assert_eq!(whole(start, tools, text, reason), want, "{text:?} whole");
    let cuts: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
    for &i in &cuts {
        for &j in cuts.iter().filter(|&&j| j >= i) {
            let pieces = [&text[..i], &text[i..j], &text[j..]];
            assert_eq!(
                streamed(start, tools, &pieces, reason),
                want,
                "{text:?} cut at {i} and {j}"
            );
        }
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(streamed(start, tools, &pieces, reason), want, "{text:?} by chars");
}

#[test]
fn the_block_splits_the_same_whole_or_cut_anywhere() {
    use Start::*;
    check(
        MayOpen,
        false,
        "<think>\nLet me see: 2+2.\n</think>\n\nIt is 4.",
        "stop",
        ("\nLet me see: 2+2.\n", "It is 4.", &[], "stop"),
    );
    // No block: all content, even a `<think>` later on.
    check(
        MayOpen,
        false,
        "Hi <think>x</think>",
        "stop",
        ("", "Hi <think>x</think>", &[], "stop"),
    );
    check(MayOpen, false, "<<think>", "stop", ("", "<<think>", &[], "stop"));
    // Cut short before the tag was whole: what was generated, as content.
    check(MayOpen, false, "<thin", "length", ("", "<thin", &[], "length"));
    // Cut short inside the block: all reasoning, a partial closing tag included.
    check(
        MayOpen,
        false,
        "<think>abc</thi",
        "length",
        ("abc</thi", "", &[], "length"),
    );
    // Near-misses of the closing tag stay reasoning.
    check(
        MayOpen,
        false,
        "<think>a</thb <</think>c",
        "stop",
        ("a</thb <", "c", &[], "stop"),
    );
    // An empty block: no reasoning, and content is content.
    check(
        MayOpen,
        false,
        "<think></think>Hi",
        "stop",
        ("", "Hi", &[], "stop"),
    );
    check(
        MayOpen,
        false,
        "<think>é🚀</think> ü ",
        "stop",
        ("é🚀", "ü ", &[], "stop"),
    );
    // The prompt opened the block.
    check(
        Inside,
        false,
        "abc</think>\n\nxyz",
        "stop",
        ("abc", "xyz", &[], "stop"),
    );
    check(
        Inside,
        false,
        "never closed",
        "length",
        ("never closed", "", &[], "length"),
    );
    // The prompt closed it (thinking off): all content.
    check(
        After,
        false,
        "<think>x</think>y",
        "stop",
        ("", "<think>x</think>y", &[], "stop"),
    );
}

#[test]
fn tool_calls_after_the_block_still_parse() {
    let call = r#"<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>"#;
    check(
        Start::MayOpen,
        true,
        &format!("<think>Need the weather.</think>\n\n{call}"),
        "stop",
        (
            "Need the weather.",
            "",
            &[("get_weather", r#"{"city":"Paris"}"#)],
            "tool_calls",
        ),
    );
    check(
        Start::MayOpen,
        true,
        "<think>No tool needed.</think>\nJust text.",
        "stop",
        ("No tool needed.", "Just text.", &[], "stop"),
    );
    check(
        Start::MayOpen,
        true,
        call,
        "stop",
        ("", "", &[("get_weather", r#"{"city":"Paris"}"#)], "tool_calls"),
    );
}

#[test]
fn whole_answers_keep_their_shape() {
    let (m, _) = answer(
        Some(Start::MayOpen),
        false,
        "<think>r</think>",
        ("chatcmpl-x", 0),
        "stop".into(),
    );
    assert_eq!((m.reasoning_content.as_deref(), m.content), (Some("r"), None));
    let (m, _) = answer(
        Some(Start::MayOpen),
        false,
        "plain",
        ("chatcmpl-x", 0),
        "stop".into(),
    );
    assert_eq!((m.reasoning_content, m.content.as_deref()), (None, Some("plain")));
    let (m, _) = answer(None, false, "<think>r</think>x", ("chatcmpl-x", 0), "stop".into());
    assert_eq!(
        (m.reasoning_content.as_deref(), m.content.as_deref()),
        (None, Some("<think>r</think>x")),
        "a model that does not think is untouched"
    );
    let json = serde_json::to_value(&m).unwrap();
    assert!(json.get("reasoning_content").is_none(), "{json}");
}

#[test]
fn the_prompt_says_where_the_answer_starts() {
    let chat = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(start_of(chat), Start::MayOpen);
    assert_eq!(start_of(&format!("{chat}<think>\n")), Start::Inside);
    assert_eq!(start_of(&format!("{chat}<think>\n\n</think>\n\n")), Start::After);
    let history = format!("<|im_start|>assistant\n<think>\nr\n</think>\n\na<|im_end|>\n{chat}");
    assert_eq!(
        start_of(&history),
        Start::MayOpen,
        "a block in the history is not the answer's"
    );
    assert_eq!(start_of("say <think> in a user turn\nassistant:"), Start::MayOpen);
    assert_eq!(Start::Inside.constrained(true), Start::MayOpen);
    assert_eq!(Start::Inside.constrained(false), Start::Inside);
    assert_eq!(Start::After.constrained(true), Start::After);
}
