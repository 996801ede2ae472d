//! Chat templates: the Jinja template of `tokenizer_config.json` rendered with `minijinja`, configured
//! like Hugging Face's `apply_chat_template` (`trim_blocks`, `lstrip_blocks`, loop controls) and with
//! what real templates call: `raise_exception`, `tojson`, `strftime_now`, Python string methods
//! (`.strip()`, `.startswith()`, … via `minijinja-contrib`'s pycompat), `bos_token`/`eos_token` and
//! `add_generation_prompt`, and extra variables a request passes (`chat_template_kwargs`, e.g. Qwen3's
//! `enable_thinking`), which may not shadow any of those ([`ChatTemplate::RESERVED`]).
//!
//! Invariants: the template is compiled once, at load, so a broken template fails start-up rather than
//! a request; `raise_exception(msg)` becomes [`EngineError::Template`] carrying `msg` (the server maps
//! it to a 400). Rendering has no side effects and no access to the file system.

use crate::error::{EngineError, Result};
use minijinja::{Environment, Error, ErrorKind, Value};
use std::collections::BTreeMap;

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, … (templates decide what they accept).
    pub role: String,
    /// The text.
    pub content: String,
    /// An assistant message's tool calls (Hugging Face's convention: `tool_calls[i].function` with
    /// `name` and `arguments` as an object when they parse as JSON).
    pub tool_calls: Vec<ToolCallMessage>,
    /// A `tool` message: the id of the call it answers.
    pub tool_call_id: Option<String>,
}

/// A tool call in the history, as templates see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCallMessage {
    /// The call's id.
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments (an object when the caller's JSON text parsed, else the text itself).
    pub arguments: serde_json::Value,
}

impl ChatMessage {
    /// A message.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// The message as a template sees it.
    fn to_value(&self) -> Value {
        let mut m = serde_json::json!({"role": self.role, "content": self.content});
        if !self.tool_calls.is_empty() {
            m["tool_calls"] = self
                .tool_calls
                .iter()
                .map(|c| {
                    serde_json::json!({"id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect();
        }
        if let Some(id) = &self.tool_call_id {
            m["tool_call_id"] = id.as_str().into();
        }
        Value::from(minijinja::value::Serde(&m))
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template's text (what it mentions, e.g. `<think>`, says what kind of model it is).
    source: String,
    bos_token: String,
    eos_token: String,
    /// Whether the template writes the `tools` it is given into the prompt (probed at load).
    renders_tools: bool,
}

/// The name of the tool the load-time probe offers the template.
const PROBE_TOOL: &str = "modelfleet_probe_tool";

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Names the renderer sets or defines itself, which extra variables may not shadow: the context
    /// (`messages`, `tools`, `add_generation_prompt`, `bos_token`, `eos_token`) and the functions
    /// templates call (ours and minijinja's globals).
    pub const RESERVED: &'static [&'static str] = &[
        "messages",
        "tools",
        "add_generation_prompt",
        "bos_token",
        "eos_token",
        "raise_exception",
        "strftime_now",
        "range",
        "dict",
        "namespace",
        "debug",
        "loop",
        "self",
        "true",
        "false",
        "none",
        "True",
        "False",
        "None",
    ];

    /// Compiles `source`; `bos_token`/`eos_token` are the strings the template sees.
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| EngineError::Template(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| -> Result<Value, Error> {
            Ok(Value::from(strftime_now(&fmt)))
        });
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| EngineError::Template(describe(&e)))?;
        let mut t = Self {
            env,
            source: source.to_string(),
            bos_token: bos_token.unwrap_or("").into(),
            eos_token: eos_token.unwrap_or("").into(),
            renders_tools: false,
        };
        let probe = serde_json::json!([{"type": "function", "function": {"name": PROBE_TOOL,
            "description": "", "parameters": {"type": "object", "properties": {}}}}]);
        t.renders_tools = t
            .render_with_tools(&[ChatMessage::new("user", "hi")], Some(&probe), true)
            .is_ok_and(|text| text.contains(PROBE_TOOL));
        Ok(t)
    }

    /// The template's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template writes the `tools` it is given (Hugging Face's `tools` variable) into the
    /// prompt. ChatML templates such as SmolLM2's do not; then the server describes the tools itself.
    pub fn renders_tools(&self) -> bool {
        self.renders_tools
    }

    /// Renders `messages`; with `add_generation_prompt` the template opens the assistant's turn.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`render`](Self::render), passing `tools` (a list of `{"type": "function", "function": …}`) to
    /// the template as Hugging Face's `apply_chat_template(tools=…)` does.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_with(messages, tools, add_generation_prompt, None)
    }

    /// [`render_with_tools`](Self::render_with_tools) with `extra` variables (Hugging Face's
    /// `apply_chat_template(**kwargs)`); a name in [`Self::RESERVED`] is refused, never shadowed.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        extra: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String> {
        let msgs: Vec<Value> = messages.iter().map(ChatMessage::to_value).collect();
        let mut ctx: BTreeMap<&str, Value> = BTreeMap::new();
        for (k, v) in extra.into_iter().flatten() {
            if Self::RESERVED.contains(&k.as_str()) {
                return Err(EngineError::Template(format!(
                    "the variable `{k}` is set by the server and cannot be passed"
                )));
            }
            ctx.insert(k.as_str(), Value::from(minijinja::value::Serde(v)));
        }
        ctx.insert("messages", Value::from(msgs));
        if let Some(tools) = tools {
            ctx.insert("tools", Value::from(minijinja::value::Serde(tools)));
        }
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        ctx.insert("bos_token", Value::from(self.bos_token.as_str()));
        ctx.insert("eos_token", Value::from(self.eos_token.as_str()));
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| EngineError::Template(describe(&e)))?;
        tmpl.render(ctx).map_err(|e| EngineError::Template(describe(&e)))
    }
}

/// The error with its detail (the `raise_exception` message) and location.
fn describe(e: &Error) -> String {
    match (e.kind(), e.detail()) {
        (ErrorKind::InvalidOperation, Some(d)) => d.to_string(),
        _ => e.to_string(),
    }
}

/// Today's date (UTC) for the few `strftime` codes templates use (`%d %b %Y`, `%Y-%m-%d`, `%B`).
fn strftime_now(fmt: &str) -> String {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let name = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('b') => out.push_str(&name[..3]),
            Some('B') => out.push_str(name),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-Instruct's template (ChatML with a default system prompt).
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    /// Mistral-style: alternation enforced with raise_exception, `.strip()`, bos/eos tokens.
    const MISTRAL: &str = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'].strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}";

    /// Loop controls, tojson, namespace, trim/lstrip blocks.
    const FANCY: &str = "{%- set ns = namespace(n=0) %}
{%- for m in messages %}
    {%- if m.role == 'system' %}{% continue %}{% endif %}
    {%- set ns.n = ns.n + 1 %}
    {{- m.content | tojson }}
    {%- if ns.n == 2 %}{% break %}{% endif %}
{%- endfor %}
{{- '|' ~ ns.n }}";

    fn check(template: &str, msgs: &[(&str, &str)], add_gen: bool, want: Result<&str, &str>) {
        let t = ChatTemplate::new(template, Some("<s>"), Some("</s>")).unwrap();
        let msgs: Vec<ChatMessage> = msgs.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect();
        match (t.render(&msgs, add_gen), want) {
            (Ok(got), Ok(w)) => assert_eq!(got, w),
            (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e} lacks {w}"),
            (got, w) => panic!("got {got:?}, want {w:?}"),
        }
    }

    #[test]
    fn renders_real_templates() {
        check(
            SMOLLM2,
            &[("user", "Hi")],
            true,
            Ok(
                "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
            ),
        );
        check(
            SMOLLM2,
            &[("system", "S"), ("user", "Hi")],
            false,
            Ok("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"),
        );
        check(
            MISTRAL,
            &[("user", "  a  "), ("assistant", "b"), ("user", "c")],
            false,
            Ok("<s>[INST] a [/INST]b</s>[INST] c [/INST]"),
        );
        check(
            MISTRAL,
            &[("user", "a"), ("user", "b")],
            false,
            Err("Conversation roles must alternate"),
        );
        check(
            FANCY,
            &[
                ("system", "s"),
                ("user", "a\"b"),
                ("assistant", "c"),
                ("user", "d"),
            ],
            false,
            Ok("\"a\\\"b\"\"c\"|2"),
        );
    }

    /// A Hermes/Qwen-style template: tools in the system turn, calls and tool results in the history.
    const WITH_TOOLS: &str = "{%- if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>\n{% endif %}{%- for m in messages %}{% if m.tool_calls is defined %}{% for c in m.tool_calls %}<call>{{ c.function.name }} {{ c.function.arguments | tojson }}</call>{% endfor %}{% elif m.role == 'tool' %}<result id={{ m.tool_call_id }}>{{ m.content }}</result>{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}";

    #[test]
    fn tools_and_calls_reach_templates_that_render_them() {
        let t = ChatTemplate::new(WITH_TOOLS, None, None).unwrap();
        assert!(t.renders_tools());
        assert!(!ChatTemplate::new(SMOLLM2, None, None).unwrap().renders_tools());
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls = vec![ToolCallMessage {
            id: "c1".into(),
            name: "get_weather".into(),
            arguments: serde_json::json!({"city": "Paris"}),
        }];
        let mut result = ChatMessage::new("tool", "18C");
        result.tool_call_id = Some("c1".into());
        let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather"}}]);
        let out = t
            .render_with_tools(
                &[ChatMessage::new("user", "weather?"), call, result],
                Some(&tools),
                false,
            )
            .unwrap();
        assert_eq!(
            out,
            "<tools>get_weather;</tools>\nuser: weather?\n<call>get_weather {\"city\": \"Paris\"}</call><result id=c1>18C</result>"
        );
    }

    #[test]
    fn extra_variables_reach_the_template_but_never_shadow_its_own() {
        let src = "{% if enable_thinking is defined and not enable_thinking %}off{% else %}on{% endif %}|{{ messages | length }}";
        let t = ChatTemplate::new(src, None, None).unwrap();
        assert_eq!(t.source(), src);
        let msgs = [ChatMessage::new("user", "hi")];
        let kw = |v: serde_json::Value| v.as_object().unwrap().clone();
        let off = kw(serde_json::json!({"enable_thinking": false}));
        assert_eq!(t.render_with(&msgs, None, true, Some(&off)).unwrap(), "off|1");
        assert_eq!(t.render(&msgs, true).unwrap(), "on|1");
        let bad = kw(serde_json::json!({"messages": []}));
        let e = t.render_with(&msgs, None, true, Some(&bad)).unwrap_err();
        assert!(e.to_string().contains("`messages`"), "{e}");
    }

    #[test]
    fn broken_template_fails_at_load() {
        assert!(matches!(
            ChatTemplate::new("{% for %}", None, None),
            Err(EngineError::Template(_))
        ));
    }

    #[test]
    fn strftime_now_formats_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_000), (2024, 10, 4));
        let s = strftime_now("%d %b %Y");
        assert_eq!(s.len(), 11, "{s}");
    }
}
