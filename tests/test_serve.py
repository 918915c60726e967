"""``python -m sekv_gguf serve`` on 127.0.0.1, driven by the real ``openai`` client, on SmolLM2-135M-Instruct with
a 512-cell SeKV memory (conversations past ~300 tokens are compressed)."""

from __future__ import annotations

import json
import os
import threading

import httpx
import openai
import pytest

from helpers import prose

pytestmark = pytest.mark.serve

DOC = prose(6000, 300)  # ~1300 tokens of natural text: more than the scratch context takes


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", timeout=300, max_retries=0)


def _stats(server) -> dict:
    return httpx.get(server + "/sekv/stats", timeout=300).json()


def test_models_list_the_alias_and_the_logical_context(client):
    m = client.models.list().data
    assert [x.id for x in m] == ["smol"]
    assert m[0].context_length == 4096 and m[0].meta["device_cells"] == 512


def test_chat_and_completions_streamed_and_not(client):
    msgs = [{"role": "user", "content": "Name three colours."}]
    r = client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=12)
    assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5 and r.usage.completion_tokens > 0
    parts = list(client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=12,
                                                stream=True, stream_options={"include_usage": True}))
    text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert text == r.choices[0].message.content  # greedy: the same reply, streamed
    assert parts[-1].usage.prompt_tokens == r.usage.prompt_tokens and not parts[-1].choices
    c = client.completions.create(model="smol", prompt="The capital of France is", max_tokens=6, temperature=0)
    streamed = "".join(p.choices[0].text for p in client.completions.create(
        model="smol", prompt="The capital of France is", max_tokens=6, temperature=0, stream=True))
    assert c.choices[0].text and streamed == c.choices[0].text


def test_stop_seed_and_json(client):
    r = client.completions.create(model="smol", prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=[" 7"])
    assert " 7" not in r.choices[0].text and r.choices[0].finish_reason == "stop"
    msgs = [{"role": "user", "content": "Write a word."}]
    a, b = (client.chat.completions.create(model="smol", messages=msgs, temperature=1.0, seed=42, max_tokens=10)
            .choices[0].message.content for _ in range(2))
    assert a == b
    r = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Give a JSON object."}],
                                       response_format={"type": "json_object"}, max_tokens=40, temperature=0)
    if r.choices[0].finish_reason == "stop":
        json.loads(r.choices[0].message.content)  # the grammar made it valid JSON


def test_a_conversation_reuses_its_memory_across_turns_regenerate_and_side_requests(client, server):
    msgs = [{"role": "system", "content": "You answer questions about a document."},
            {"role": "user", "content": f"Document:\n{DOC}\n\nWhat is the document about?"}]
    r1 = client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=24)
    msgs.append({"role": "assistant", "content": r1.choices[0].message.content})
    msgs.append({"role": "user", "content": "Say it in five words."})
    r2 = client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=24)
    assert r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens  # turn 1 was reused
    assert _stats(server)["evaluated_tokens"] < r2.usage.prompt_tokens - r1.usage.prompt_tokens + 40
    # regenerate turn 2: no prompt re-evaluation beyond its last token (the prompt's checkpoint comes back)
    client.chat.completions.create(model="smol", messages=msgs, temperature=0.8, seed=1, max_tokens=24)
    s = _stats(server)
    assert s["evaluated_tokens"] <= 1 and s["cached_tokens"] == r2.usage.prompt_tokens - 1
    assert s["sekv"]["spans"] > 0  # the memory is compressed
    # a title request between turns (what Open WebUI sends) goes to the scratch context
    client.chat.completions.create(model="smol", max_tokens=10, messages=[
        {"role": "user", "content": "Create a concise, 3-5 word title for the chat about a document."}])
    msgs.append({"role": "assistant", "content": r2.choices[0].message.content})
    msgs.append({"role": "user", "content": "Thanks. One more word?"})
    r3 = client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=8)
    assert r3.usage.prompt_tokens_details.cached_tokens >= r2.usage.prompt_tokens
    assert _stats(server)["scratch_requests"] >= 1


def test_four_concurrent_streams_all_finish(client):
    results: list[str | None] = [None] * 4

    def run(i: int) -> None:
        stream = client.chat.completions.create(model="smol", stream=True, max_tokens=8, temperature=0.5, seed=i,
                                                messages=[{"role": "user", "content": f"Count to {i + 3}."}])
        for part in stream:
            if part.choices and part.choices[0].finish_reason:
                results[i] = part.choices[0].finish_reason

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert all(r in ("stop", "length") for r in results), results


def test_a_client_that_disconnects_mid_stream_leaves_the_server_healthy(client, server):
    with httpx.stream("POST", server + "/v1/chat/completions", timeout=300, json={
            "messages": [{"role": "user", "content": "Tell a long story."}], "stream": True, "max_tokens": 40}) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 3:
                break  # hang up
    r = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("body, code", [
    (b"{not json", 400),
    (json.dumps({"messages": "hello"}).encode(), 400),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}).encode(), 400),
    (json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}).encode(), 400),
    (json.dumps({"messages": [{"role": "user", "content": "word " * 5000}]}).encode(), 400),
])
def test_bad_requests_get_openai_shaped_4xx(server, body, code):
    r = httpx.post(server + "/v1/chat/completions", content=body, headers={"content-type": "application/json"},
                   timeout=300)
    assert r.status_code == code, r.text
    assert set(r.json()["error"]) >= {"message", "type", "code"}


def test_a_developer_message_is_a_system_message(client):
    r = client.chat.completions.create(model="smol", max_tokens=4, messages=[
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]}, {"role": "user", "content": "Hi"}])
    assert r.choices[0].finish_reason in ("stop", "length")


def test_a_base_model_refuses_chat_naming_chat_format(tiny_llama):
    from sekv_gguf.llm import SekvLlama, UnsupportedError

    llm = SekvLlama(str(tiny_llama), kv_budget=512, n_ctx=2048)
    try:
        with pytest.raises(UnsupportedError, match="chat_format"):
            llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=2)
        assert llm.create_completion("hello", max_tokens=2)["choices"]  # plain completions work
    finally:
        llm.close()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    os.environ.setdefault("NO_PROXY", "127.0.0.1")
