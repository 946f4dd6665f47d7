"""Ollama's API over real HTTP, driven by the real ``ollama`` client and ``langchain-ollama``:
SmolLM2-135M (behind an API key) for the shapes, the options and bad input; Qwen2.5-Coder
0.5B where tools and JSON formats matter. Greedy answers are compared with the OpenAI
routes' own: both paths run the same request through the same engine."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from localspec import Engine
from localspec.server.app import ServerSettings
from tests.test_server import LiveServer, leave_a_whole_answer, post, requests_counted, wait_for

AUTH = {"Authorization": "Bearer k1"}
TYPED_NAME = "smollm2-135m"  # the name the model was served under (``model_names``)
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def smollm(smollm_path: Path) -> Iterator[Engine]:
    with Engine.load(smollm_path, mode="ngram-simple", n_ctx=1024, parallel=2) as engine:
        yield engine


@pytest.fixture(scope="module")
def base(smollm: Engine) -> Iterator[str]:
    settings = ServerSettings(api_keys=("k1",), model_names=(TYPED_NAME,))
    with LiveServer(smollm, settings) as url:
        yield url


@pytest.fixture(scope="module")
def client(base: str) -> ollama.Client:
    return ollama.Client(host=base, headers=AUTH, timeout=120)


@pytest.fixture(scope="module")
def name(smollm: Engine) -> str:
    return f"{smollm.target_path.stem}:latest"


@pytest.fixture(scope="module")
def qwen_engine(qwen_path: Path) -> Iterator[Engine]:
    with Engine.load(qwen_path, mode="ngram-simple", n_ctx=2048, parallel=2) as engine:
        yield engine


@pytest.fixture(scope="module")
def qwen_base(qwen_engine: Engine) -> Iterator[str]:
    with LiveServer(qwen_engine, ServerSettings()) as url:
        yield url


@pytest.fixture(scope="module")
def qwen(qwen_base: str) -> ollama.Client:
    return ollama.Client(host=qwen_base, timeout=120)


@pytest.fixture(scope="module")
def qwen_name(qwen_engine: Engine) -> str:
    return qwen_engine.target_path.stem


def openai_chat(base: str, messages: list[dict[str, Any]], tokens: int) -> str:
    body = {"messages": messages, "max_tokens": tokens, **GREEDY}
    r = post(base, "/v1/chat/completions", body, headers=AUTH)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def ollama_post(base: str, path: str, body: object) -> httpx.Response:
    return post(base, path, body, headers=AUTH)


def refused(r: httpx.Response, status: int = 400) -> str:
    """The message of an error in Ollama's shape."""
    assert r.status_code == status, r.text
    body = r.json()
    assert list(body) == ["error"] and isinstance(body["error"], str)
    return body["error"]


# ----- what is served ---------------------------------------------------------------------------


def test_root_and_version_answer_as_ollama(base: str) -> None:
    root = httpx.get(f"{base}/")
    assert root.status_code == 200 and root.text == "Ollama is running"
    assert httpx.head(f"{base}/").status_code == 200
    version = httpx.get(f"{base}/api/version", headers=AUTH)
    assert re.fullmatch(r"\d+\.\d+\.\d+", version.json()["version"])
    assert refused(httpx.get(f"{base}/api/version"), 401)  # behind the key, as the rest


def test_list_show_and_ps_describe_the_loaded_model(
    client: ollama.Client, smollm: Engine, name: str
) -> None:
    (listed,) = client.list().models
    assert listed.model == name
    assert listed.size == smollm.target_path.stat().st_size
    assert listed.digest is not None and re.fullmatch(r"[0-9a-f]{64}", listed.digest)
    assert listed.details is not None
    assert (listed.details.format, listed.details.family) == ("gguf", "llama")
    assert listed.details.quantization_level == "Q4_1"
    assert listed.details.parameter_size == "135M"
    for asked in (name, name.removesuffix(":latest"), TYPED_NAME, f"{TYPED_NAME}:latest"):
        shown = client.show(asked)
        assert shown.template == smollm.target.chat_template()
        assert shown.capabilities is not None and "completion" in shown.capabilities
        assert "insert" not in shown.capabilities  # SmolLM2 has no fill-in-the-middle tokens
        assert shown.modelinfo is not None
        assert shown.modelinfo["general.architecture"] == "llama"
        assert shown.modelinfo["general.parameter_count"] > 100_000_000
    (running,) = client.ps().models
    assert running.model == name and running.context_length == smollm.target.n_ctx
    assert running.digest == listed.digest


def test_a_model_not_served_is_a_404(client: ollama.Client, base: str) -> None:
    with pytest.raises(ollama.ResponseError) as shown:
        client.show("llama3.2")
    assert shown.value.status_code == 404 and shown.value.error == "model 'llama3.2' not found"
    with pytest.raises(ollama.ResponseError) as chat:
        client.chat(model="llama3.2", messages=[{"role": "user", "content": "Hi"}])
    assert chat.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as streamed:
        next(iter(client.generate(model="llama3.2", prompt="Hi", stream=True)))
    assert streamed.value.status_code == 404


# ----- chat and generate ------------------------------------------------------------------------


def test_chat_whole_and_streamed_are_the_openai_greedy_answer(
    client: ollama.Client, base: str, name: str
) -> None:
    messages = [{"role": "user", "content": "Name three colours."}]
    options = {**GREEDY, "num_predict": 16}
    whole = client.chat(model=name, messages=messages, options=options)
    assert whole.done and whole.message.role == "assistant"
    parts = list(client.chat(model=name, messages=messages, options=options, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    streamed = "".join(p.message.content or "" for p in parts)
    assert whole.message.content == streamed == openai_chat(base, messages, 16)
    last = parts[-1]
    assert last.done_reason == whole.done_reason and last.eval_count == whole.eval_count
    assert whole.eval_count is not None and 0 < whole.eval_count <= 16
    assert last.prompt_eval_count is not None and last.prompt_eval_count > 0
    assert last.total_duration and last.eval_duration and last.prompt_eval_duration
    assert last.total_duration >= last.eval_duration  # nanoseconds, queue and prompt included


def test_chat_streams_ndjson_with_the_figures_on_the_last_line(base: str, name: str) -> None:
    body = {"model": name, "messages": [{"role": "user", "content": "Hi"}]}
    body["options"] = {**GREEDY, "num_predict": 6}
    with httpx.stream("POST", f"{base}/api/chat", json=body, headers=AUTH, timeout=120) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z", x["created_at"]) for x in lines)
    last = lines[-1]
    assert last["done"] is True and last["model"] == name
    assert last["speculative"]["mode"] == "ngram-simple"
    assert last["load_duration"] == 0 and last["eval_count"] == 6


def test_generate_raw_and_templated(client: ollama.Client, base: str, name: str) -> None:
    options = {**GREEDY, "num_predict": 12}
    prompt = "The capital of France is"
    raw = client.generate(model=name, prompt=prompt, raw=True, options=options)
    body = {"prompt": prompt, "max_tokens": 12, **GREEDY}
    completion = post(base, "/v1/completions", body, headers=AUTH).json()
    assert raw.response == completion["choices"][0]["text"]
    assert raw.context == [] and raw.eval_count == completion["usage"]["completion_tokens"]
    unspeculated = {"model": name, "prompt": prompt, "raw": True, "stream": False}
    unspeculated |= {"options": options, "speculative": {"mode": "none"}}
    plain = post(base, "/api/generate", unspeculated, headers=AUTH).json()
    assert plain["response"] == raw.response and plain["speculative"]["mode"] == "none"
    streamed = client.generate(model=name, prompt=prompt, raw=True, options=options, stream=True)
    assert "".join(p.response or "" for p in streamed) == raw.response
    # not raw: the prompt is the user's turn of the model's chat template, as Ollama does
    templated = client.generate(model=name, prompt="Name a fruit.", options=options)
    assert templated.response == openai_chat(
        base, [{"role": "user", "content": "Name a fruit."}], 12
    )
    system = [{"role": "system", "content": "Answer in French."}]
    with_system = client.generate(
        model=name, prompt="Name a fruit.", system="Answer in French.", options=options
    )
    user = [{"role": "user", "content": "Name a fruit."}]
    assert with_system.response == openai_chat(base, system + user, 12)


def test_options_num_predict_stop_and_seed(client: ollama.Client, base: str, name: str) -> None:
    prompt = "Count: one, two, three, four, five,"
    options: dict[str, Any] = {**GREEDY, "num_predict": 20}
    text = client.generate(model=name, prompt=prompt, raw=True, options=options).response
    assert text is not None
    stop = text.split()[2]
    cut = client.generate(model=name, prompt=prompt, raw=True, options={**options, "stop": [stop]})
    assert cut.response == text[: text.index(stop)] and cut.done_reason == "stop"
    unlimited = client.generate(model=name, prompt="Say hi.", options={**GREEDY, "num_predict": -1})
    assert unlimited.done_reason == "stop"  # the model ended it
    seeded = {"temperature": 1.0, "seed": 1234, "num_predict": 12, "top_k": 0, "top_p": 1.0}
    first = client.generate(model=name, prompt="Once upon a time", raw=True, options=seeded)
    again = client.generate(model=name, prompt="Once upon a time", raw=True, options=seeded)
    assert first.response == again.response
    # neutral values of what the engine does not do are accepted, loading options ignored
    ignored = {**GREEDY, "num_predict": 4, "tfs_z": 1.0, "num_ctx": 8192, "mirostat": 0}
    assert client.generate(model=name, prompt=prompt, raw=True, options=ignored).eval_count == 4
    # a repeat penalty is applied (a list that repeats its words is written otherwise)
    listing = "Write the word 'cat' ten times, separated by commas:"
    plain = client.generate(model=name, prompt=listing, options={**GREEDY, "num_predict": 12})
    penalized = {**GREEDY, "num_predict": 12, "repeat_penalty": 1.5, "repeat_last_n": 32}
    assert client.generate(model=name, prompt=listing, options=penalized).response != plain.response
    # none where none is given (Ollama's default since 2026), the same as the OpenAI route's
    asked = {"messages": [{"role": "user", "content": listing}], "max_tokens": 12}
    openai = post(base, "/v1/chat/completions", {**asked, "temperature": 0}, headers=AUTH)
    assert plain.response == openai.json()["choices"][0]["message"]["content"]


def test_the_load_call_answers_at_once(client: ollama.Client, name: str) -> None:
    loaded = client.generate(model=name, prompt="")
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    chat = client.chat(model=name, messages=[])
    assert chat.done and chat.done_reason == "load" and chat.message.content == ""


def test_a_client_that_leaves_a_stream_stops_its_generation(base: str, name: str) -> None:
    body = {
        "model": name,
        "messages": [{"role": "user", "content": "Write a long essay about rivers."}],
        "options": {**GREEDY, "num_predict": 900},
    }
    left_before = counted(base, "/api/chat", 499)
    with httpx.stream("POST", f"{base}/api/chat", json=body, headers=AUTH, timeout=120) as r:
        first = next(line for line in r.iter_lines() if line)
    assert json.loads(first)["done"] is False
    wait_for(lambda: health(base)["slots_busy"] == 0, seconds=10)
    wait_for(lambda: counted(base, "/api/chat", 499) == left_before + 1, seconds=5)


def test_whole_answers_end_a_generation_the_client_stops_awaiting(base: str, name: str) -> None:
    body = {
        "model": name,
        "prompt": "Write a long essay about rivers.",
        "stream": False,
        "options": {**GREEDY, "num_predict": 900},
    }
    left_before = counted(base, "/api/generate", 499)
    leave_a_whole_answer(base, "/api/generate", body, AUTH)
    wait_for(lambda: counted(base, "/api/generate", 499) == left_before + 1, seconds=10)
    assert health(base)["slots_busy"] == 0


def health(base: str) -> dict[str, Any]:
    return httpx.get(f"{base}/health").json()


def counted(base: str, endpoint: str, status: int) -> float:
    return requests_counted(base, endpoint, status, AUTH)


# ----- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("/api/chat", {"messages": [{"role": "user", "content": "Hi"}]}, "model is required"),
        ("/api/chat", [1, 2], "JSON object"),
        ("/api/chat", {"messages": "Hi"}, "messages"),
        ("/api/chat", {"messages": [{"role": "user", "content": 3}]}, "messages.0.content"),
        ("/api/chat", {"messages": [{"role": "robot", "content": "Hi"}]}, "messages.0.role"),
        (
            "/api/chat",
            {"messages": [{"role": "user", "content": "Hi", "images": ["aGk="]}]},
            "images",
        ),
        ("/api/generate", {"prompt": "Hi", "images": ["aGk="]}, "images"),
        ("/api/generate", {"prompt": "Hi", "template": "{{ .Prompt }}"}, "template"),
        ("/api/generate", {"prompt": "Hi", "context": [1, 2, 3]}, "context"),
        ("/api/generate", {"prompt": "def f(", "suffix": "\n    return x"}, "fill in the middle"),
        ("/api/generate", {"prompt": "Hi", "stream": "yes"}, "stream"),
        ("/api/generate", {"prompt": "Hi", "format": "yaml"}, "format"),
        ("/api/generate", {"prompt": "Hi", "format": 3}, "format"),
        ("/api/generate", {"prompt": "Hi", "format": "json", "raw": True}, "format"),
        ("/api/generate", {"prompt": "Hi", "logprobs": True}, "logprobs"),
        ("/api/generate", {"prompt": "Hi", "options": "hot"}, "options"),
        ("/api/generate", {"prompt": "Hi", "options": {"temperature": "hot"}}, "temperature"),
        ("/api/generate", {"prompt": "Hi", "options": {"temperature": 9}}, "options.temperature"),
        ("/api/generate", {"prompt": "Hi", "options": {"num_predict": 0}}, "options.num_predict"),
        ("/api/generate", {"prompt": "Hi", "options": {"top_k": 1.5}}, "options.top_k"),
        ("/api/generate", {"prompt": "Hi", "options": {"stop": [1]}}, "options.stop"),
        (
            "/api/generate",
            {"prompt": "Hi", "options": {"repeat_penalty": -1}},
            "options.repeat_penalty",
        ),
        ("/api/generate", {"prompt": "Hi", "options": {"mirostat": 2}}, "options.mirostat"),
        (
            "/api/generate",
            {"prompt": "Hi", "options": {"frequency_penalty": 5}},
            "options.frequency_penalty",
        ),
        ("/api/generate", {"prompt": "Hi", "options": {"repeat_last_n": -2}}, "repeat_last_n"),
        ("/api/show", {}, "model is required"),
    ],
)
def test_bad_input_is_a_400_in_ollamas_shape(
    base: str, name: str, path: str, body: Any, says: str
) -> None:
    if isinstance(body, dict) and path != "/api/show" and says != "model is required":
        body = {"model": name, **body}
    assert says in refused(ollama_post(base, path, body))


def test_malformed_json_and_a_missing_key(base: str, name: str) -> None:
    bad = httpx.post(f"{base}/api/chat", content=b'{"model": ', headers=AUTH, timeout=30)
    assert "malformed JSON" in refused(bad)
    body = {"model": name, "prompt": "Hi"}
    assert "API key" in refused(post(base, "/api/generate", body), 401)
    assert "API key" in refused(httpx.get(f"{base}/api/tags"), 401)


def test_a_refusal_streams_nothing(client: ollama.Client, name: str) -> None:
    """Refused before it starts: the client raises with the status, also when streaming."""
    hot = {"temperature": 9}
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(ollama.ResponseError) as refused_stream:
        next(iter(client.chat(model=name, messages=messages, stream=True, options=hot)))
    assert refused_stream.value.status_code == 400
    assert "options.temperature" in refused_stream.value.error


# ----- tools and formats (Qwen2.5-Coder) --------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_a_tool_call_comes_back_with_object_arguments(qwen: ollama.Client, qwen_name: str) -> None:
    options = {**GREEDY, "num_predict": 48}
    whole = qwen.chat(model=qwen_name, messages=ASK_WEATHER, tools=[WEATHER], options=options)
    assert whole.message.tool_calls, whole.message
    (call,) = whole.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    assert not whole.message.content and whole.done_reason == "stop"
    parts = list(
        qwen.chat(
            model=qwen_name, messages=ASK_WEATHER, tools=[WEATHER], options=options, stream=True
        )
    )
    calls = [c for p in parts for c in p.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert "".join(p.message.content or "" for p in parts) == ""  # no call leaks as text
    # the turn after the call: the call, then its result as a tool message
    follow = [
        *ASK_WEATHER,
        {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
        {"role": "tool", "content": "18 degrees, sunny", "tool_name": "get_weather"},
    ]
    answer = qwen.chat(model=qwen_name, messages=follow, tools=[WEATHER], options=options)
    assert answer.message.content and not answer.message.tool_calls


def test_a_python_function_with_a_union_parameter_as_a_tool(
    qwen: ollama.Client, qwen_name: str
) -> None:
    """The client writes ``city: str | int`` as ``"type": "integer, string"`` (one string
    naming both types); Ollama takes it, and so must this server."""

    def get_weather(city: str | int) -> str:
        """The current weather in a city.

        Args:
            city: The city's name or its postal code
        """
        return "sunny"

    options = {**GREEDY, "num_predict": 48}
    whole = qwen.chat(model=qwen_name, messages=ASK_WEATHER, tools=[get_weather], options=options)
    (call,) = whole.message.tool_calls or []
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}


def test_json_format_and_a_schema(qwen: ollama.Client, qwen_name: str) -> None:
    options = {**GREEDY, "num_predict": 64}
    ask = [{"role": "user", "content": "Bob is 31 years old. Describe him as JSON."}]
    anything = qwen.chat(model=qwen_name, messages=ask, format="json", options=options)
    assert isinstance(json.loads(anything.message.content or ""), dict)
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    shaped = qwen.chat(model=qwen_name, messages=ask, format=schema, options=options)
    person = json.loads(shaped.message.content or "")
    assert set(person) == {"name", "age"} and isinstance(person["age"], int)
    generated = qwen.generate(
        model=qwen_name, prompt=ask[0]["content"], format=schema, options=options
    )
    assert set(json.loads(generated.response or "")) == {"name", "age"}


def test_generate_with_a_suffix_fills_the_middle(
    qwen: ollama.Client, qwen_base: str, qwen_name: str
) -> None:
    """Zed's edit prediction and other Ollama-speaking editors: ``suffix`` on /api/generate,
    the same middle as OpenAI's ``suffix`` on /v1/completions."""
    assert "insert" in (qwen.show(qwen_name).capabilities or [])
    before, after = "def area(width, height):\n    ", "\n\nprint(area(2, 3))\n"
    options = {"num_predict": 16, **GREEDY}
    got = qwen.generate(qwen_name, before, suffix=after, options=options)
    assert got.done and got.response.strip()
    openai_style = post(
        qwen_base,
        "/v1/completions",
        {"prompt": before, "suffix": after, "max_tokens": 16, **GREEDY},
    ).json()
    assert got.response == openai_style["choices"][0]["text"]
    refused = ollama_post(
        qwen_base,
        "/api/generate",
        {"model": qwen_name, "prompt": before, "suffix": after, "format": "json"},
    )
    assert refused.status_code == 400 and "suffix" in refused.json()["error"]


def test_langchain_ollama_round_trip(qwen: ollama.Client, qwen_base: str, qwen_name: str) -> None:
    from langchain_ollama import ChatOllama

    llm = ChatOllama(base_url=qwen_base, model=qwen_name, temperature=0, num_predict=12)
    answer = llm.invoke("Say hello.")
    direct = qwen.chat(
        model=qwen_name,
        messages=[{"role": "user", "content": "Say hello."}],
        options={**GREEDY, "num_predict": 12},
    )
    assert answer.content == direct.message.content
    assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] <= 12
    # a call takes more than 12 tokens: one cut short would come back as text
    longer = ChatOllama(base_url=qwen_base, model=qwen_name, temperature=0, num_predict=48)
    called = longer.bind_tools([WEATHER]).invoke("What is the weather in Paris?")
    assert [c["name"] for c in called.tool_calls] == ["get_weather"]


def test_an_unknown_path_or_method_is_an_error_in_ollamas_shape(base: str) -> None:
    unknown = httpx.post(f"{base}/api/pull", json={"model": "x"}, headers=AUTH, timeout=30)
    assert unknown.status_code == 404 and isinstance(unknown.json()["error"], str)
    wrong = httpx.get(f"{base}/api/chat", headers=AUTH, timeout=30)
    assert wrong.status_code == 405 and isinstance(wrong.json()["error"], str)
