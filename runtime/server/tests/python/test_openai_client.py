"""The runtime driven by the official `openai` Python package — the client users have.

Run by runtime/server/tests/openai_client.rs, which starts `modelfleet-runtime serve` on a generated
tiny model with two tenants and passes MF_BASE_URL, MF_MODEL, MF_KEY_A and MF_KEY_B.
"""

import asyncio
import os
import re
import time
import urllib.request

import json
import urllib.error
import openai
import pytest

BASE = os.environ["MF_BASE_URL"]
ADMIN = os.environ["MF_ADMIN_URL"]  # /metrics lives on the admin port
MODEL = os.environ["MF_MODEL"]
KEY_A = os.environ["MF_KEY_A"]
KEY_B = os.environ["MF_KEY_B"]


def client(key=KEY_A):
    # No retries: a 429 must reach the test, not be retried away.
    return openai.OpenAI(base_url=f"{BASE}/v1", api_key=key, max_retries=0, timeout=60)


def aclient(key=KEY_A):
    return openai.AsyncOpenAI(base_url=f"{BASE}/v1", api_key=key, max_retries=0, timeout=60)


def chat(c=None, **kw):
    args = dict(model=MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=12, temperature=0)
    args.update(kw)
    return (c or client()).chat.completions.create(**args)


def metric(name, **labels):
    """Sum of a metric's samples (matching labels) from /metrics."""
    text = urllib.request.urlopen(f"{ADMIN}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total



def test_models_lists_the_served_model():
    ids = [m.id for m in client().models.list().data]
    assert ids == [MODEL]


def test_chat_greedy_is_deterministic_with_usage():
    a = chat()
    b = chat()
    assert a.choices[0].message.role == "assistant"
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.choices[0].finish_reason == "length"
    u = a.usage
    assert u.completion_tokens == 12
    assert u.total_tokens == u.prompt_tokens + 12
    assert u.prompt_tokens_details.cached_tokens >= 0


def test_chat_stream_matches_non_stream_and_reports_usage():
    full = chat().choices[0].message.content
    chunks = list(chat(stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_completions_stream_and_echo():
    c = client()
    r = c.completions.create(model=MODEL, prompt="the quick brown", max_tokens=8, temperature=0)
    text = r.choices[0].text
    assert r.usage.completion_tokens == 8
    s = c.completions.create(model=MODEL, prompt="the quick brown", max_tokens=8, temperature=0, stream=True)
    assert "".join(ch.choices[0].text for ch in s if ch.choices) == text
    e = c.completions.create(model=MODEL, prompt="the quick brown", max_tokens=8, temperature=0, echo=True)
    assert e.choices[0].text == "the quick brown" + text
    batch = c.completions.create(model=MODEL, prompt=["the quick brown", "hello"], max_tokens=8, temperature=0)
    assert [ch.index for ch in batch.choices] == [0, 1]
    assert batch.choices[0].text == text


def test_seeds_reproduce_and_n_gives_distinct_choices():
    kw = dict(temperature=1.0, seed=1234, max_tokens=16)
    assert chat(**kw).choices[0].message.content == chat(**kw).choices[0].message.content
    r = chat(n=3, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = {c.message.content for c in r.choices}
    assert len(texts) > 1, "seeded choices use seed + index and differ"
    assert r.choices[0].message.content == chat(**kw).choices[0].message.content
    assert r.usage.completion_tokens == 48


def test_stop_strings_cut_the_text():
    full = chat(max_tokens=16).choices[0].message.content
    assert len(full) >= 8, full
    stop = full[4:7]
    want = full[: full.find(stop)]
    r = chat(max_tokens=16, stop=[stop])
    assert r.choices[0].message.content == want
    assert r.choices[0].finish_reason == "stop"


def test_logprobs():
    r = chat(logprobs=True, top_logprobs=3, max_tokens=5)
    lp = r.choices[0].logprobs.content
    assert len(lp) == 5
    for t in lp:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob, abs=1e-5)
    c = client().completions.create(model=MODEL, prompt="hello", max_tokens=4, temperature=0, logprobs=2)
    l = c.choices[0].logprobs
    assert len(l.tokens) == 4 and len(l.top_logprobs[0]) <= 2 and l.text_offset[0] == 0


def test_vllm_parameters_through_extra_body():
    r = chat(max_tokens=6, extra_body={"ignore_eos": True, "top_k": 1, "min_tokens": 6, "repetition_penalty": 1.1})
    assert r.usage.completion_tokens == 6


def test_errors_are_openai_errors_naming_the_field():
    with pytest.raises(openai.BadRequestError) as e:
        chat(extra_body={"temprature": 0.5})
    assert e.value.body["param"] == "temprature"
    with pytest.raises(openai.BadRequestError) as e:
        chat(extra_body={"functions": [{"name": "f"}]})
    assert e.value.body["param"] == "functions" and "not supported yet" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        chat(temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        chat(n=100)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.AuthenticationError):
        chat(c=client("sk-wrong"))
    with pytest.raises(openai.NotFoundError):
        chat(model="no-such-model")
    with pytest.raises(openai.APIStatusError) as e:
        chat(max_tokens=10_000_000)
    assert e.value.status_code == 413
    req = urllib.request.Request(f"{BASE}/v1/chat/completions", data=b"{not json",
                                 headers={"Authorization": f"Bearer {KEY_A}"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400 and json.load(e.value)["error"]["param"] == "body"


def test_prefix_cache_is_scoped_to_the_tenant():
    prompt = "You are a careful assistant. " * 12 + str(time.time())
    msgs = [{"role": "system", "content": prompt}, {"role": "user", "content": "hi"}]
    first = chat(messages=msgs, max_tokens=2)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = chat(messages=msgs, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens > 0, "tenant A hits its own prefix"
    other = chat(c=client(KEY_B), messages=msgs, max_tokens=2)
    assert other.usage.prompt_tokens_details.cached_tokens == 0, "tenant B never hits tenant A's prefix"
    # A salt narrows the scope further.
    salted = chat(messages=msgs, max_tokens=2, extra_body={"cache_salt": "s1"})
    assert salted.usage.prompt_tokens_details.cached_tokens == 0


def test_dropped_streams_free_everything():
    async def one(i):
        c = aclient()
        stream = await c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"stream {i}"}], max_tokens=400,
            temperature=0, stream=True, extra_body={"ignore_eos": True})
        async for _ in stream:
            break  # one chunk, then hang up
        await stream.close()
        await c.close()

    async def main():
        await asyncio.gather(*(one(i) for i in range(200)))

    asyncio.run(main())
    deadline = time.time() + 10
    while time.time() < deadline:
        if (metric("modelfleet_requests_running") == 0 and metric("modelfleet_requests_waiting") == 0
                and metric("modelfleet_kv_cache_usage_ratio") == 0):
            break
        time.sleep(0.05)
    assert metric("modelfleet_requests_running") == 0
    assert metric("modelfleet_requests_waiting") == 0
    assert metric("modelfleet_kv_cache_usage_ratio") == 0, "no KV block is held after the streams dropped"
    assert metric("modelfleet_requests_total", finish_reason="cancelled") >= 150


def test_embeddings_on_a_generation_model_are_a_400_naming_its_task():
    with pytest.raises(openai.BadRequestError) as e:
        client().embeddings.create(model=MODEL, input="hello")
    assert e.value.body["param"] == "model" and "generation model" in e.value.body["message"]
