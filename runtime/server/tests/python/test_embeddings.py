"""`/v1/embeddings` driven by the official `openai` Python package against the real all-MiniLM-L6-v2.

Run by runtime/server/tests/embeddings.rs, which starts `modelfleet-runtime serve` on the model with two
tenants and passes MF_BASE_URL, MF_ADMIN_URL, MF_MODEL, MF_KEY_A and MF_KEY_B.
"""

import array
import asyncio
import math
import os
import urllib.request

import openai
import pytest

BASE = os.environ["MF_BASE_URL"]
ADMIN = os.environ["MF_ADMIN_URL"]
MODEL = os.environ["MF_MODEL"]
KEY_A = os.environ["MF_KEY_A"]
KEY_B = os.environ["MF_KEY_B"]


def client(key=KEY_A):
    return openai.OpenAI(base_url=f"{BASE}/v1", api_key=key, max_retries=0, timeout=60)


def f32(v):
    """The values as the f32 they are (JSON writes an f32's shortest decimal, base64 its bits)."""
    return array.array("f", v)


def cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def metric(name, **labels):
    text = urllib.request.urlopen(f"{ADMIN}/metrics", timeout=10).read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{"):
            got = ",".join(sorted(line[len(name) + 1 : line.index("}")].split(",")))
            if all(f'{k}="{v}"' in got for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_default_client_path_base64_equals_float_and_vectors_are_unit_length():
    # The client asks for base64 by default and decodes it itself.
    default = client().embeddings.create(model=MODEL, input="hello")
    floats = client().embeddings.create(model=MODEL, input="hello", encoding_format="float")
    assert default.model == MODEL and default.object == "list"
    assert len(default.data) == 1 and default.data[0].index == 0
    assert len(default.data[0].embedding) == 384
    assert f32(default.data[0].embedding) == f32(floats.data[0].embedding)
    assert abs(math.sqrt(sum(x * x for x in floats.data[0].embedding)) - 1.0) < 1e-5
    # [CLS] hello [SEP]
    assert floats.usage.prompt_tokens == 3 and floats.usage.total_tokens == 3


def test_meaning_is_embedded_and_a_batch_equals_its_inputs_alone():
    texts = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "A man is riding a horse.",
        "The new movie is awesome.",
    ]
    batch = client().embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert [d.index for d in batch.data] == [0, 1, 2, 3]
    v = [d.embedding for d in batch.data]
    assert cos(v[0], v[1]) > cos(v[0], v[2]) > cos(v[0], v[3])
    assert cos(v[0], v[1]) > 0.6
    for i, t in enumerate(texts):
        alone = client().embeddings.create(model=MODEL, input=t, encoding_format="float")
        assert alone.data[0].embedding == v[i], f"input {i}: alone differs from batched"
    assert batch.usage.prompt_tokens == sum(
        client().embeddings.create(model=MODEL, input=t).usage.prompt_tokens for t in texts
    )


def test_token_ids_are_embedded_as_given():
    by_text = client().embeddings.create(model=MODEL, input="hello", encoding_format="float")
    by_ids = client().embeddings.create(model=MODEL, input=[101, 7592, 102], encoding_format="float")
    assert by_ids.data[0].embedding == by_text.data[0].embedding
    lists = client().embeddings.create(model=MODEL, input=[[101, 7592, 102], [101, 102]])
    assert len(lists.data) == 2 and lists.usage.prompt_tokens == 5


def test_concurrent_clients_get_the_same_bits_as_alone():
    texts = [f"document number {i} about topic {i % 3}" for i in range(16)]
    alone = [client().embeddings.create(model=MODEL, input=t, encoding_format="float").data[0].embedding for t in texts]

    async def run():
        c = openai.AsyncOpenAI(base_url=f"{BASE}/v1", api_key=KEY_A, max_retries=0, timeout=60)
        rs = await asyncio.gather(*(c.embeddings.create(model=MODEL, input=t, encoding_format="float") for t in texts))
        return [r.data[0].embedding for r in rs]

    assert asyncio.run(run()) == alone


def test_bad_requests_are_400s_naming_the_field():
    with pytest.raises(openai.BadRequestError) as e:
        client().embeddings.create(model=MODEL, input="hello", dimensions=128)
    assert e.value.body["param"] == "dimensions"
    with pytest.raises(openai.BadRequestError) as e:
        client().embeddings.create(model=MODEL, input="word " * 400)
    assert e.value.body["param"] == "input" and "256" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client().embeddings.create(model=MODEL, input=[])
    assert e.value.body["param"] == "input"
    with pytest.raises(openai.BadRequestError) as e:
        client().embeddings.create(model=MODEL, input=[[101, 999999]])
    assert "vocabulary" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client().embeddings.create(model="no-such-model", input="hello")
    # A full-size `dimensions` is fine.
    assert len(client().embeddings.create(model=MODEL, input="x", dimensions=384).data[0].embedding) == 384


def test_chat_on_an_embedding_model_is_a_400_and_keys_are_required():
    with pytest.raises(openai.BadRequestError) as e:
        client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert "embedding model" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client().completions.create(model=MODEL, prompt="hi")
    with pytest.raises(openai.AuthenticationError):
        client("wrong-key").embeddings.create(model=MODEL, input="hello")
    models = client().models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_usage_is_counted_per_tenant():
    before_a = metric("modelfleet_prompt_tokens_total", model=MODEL, tenant="a")
    before_b = metric("modelfleet_prompt_tokens_total", model=MODEL, tenant="b")
    client(KEY_B).embeddings.create(model=MODEL, input=["hello", "hello"])
    assert metric("modelfleet_prompt_tokens_total", model=MODEL, tenant="b") == before_b + 6
    assert metric("modelfleet_prompt_tokens_total", model=MODEL, tenant="a") == before_a
    # What the autoscaler reads of an embedding pod: its queue (and no KV pressure).
    text = urllib.request.urlopen(f"{ADMIN}/metrics", timeout=10).read().decode()
    assert f'modelfleet_requests_waiting{{model="{MODEL}"}} 0' in text
    assert f'modelfleet_kv_cache_usage_ratio{{model="{MODEL}"}} 0' in text
    assert metric("modelfleet_requests_total", model=MODEL, tenant="b", finish_reason="stop") >= 1
