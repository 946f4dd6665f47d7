"""Request bodies (pydantic) and the OpenAI-shaped error they produce when wrong.

Top-level fields that OpenAI clients commonly send but that change nothing here (``user``,
``stream_options`` without usage...) are accepted and ignored; values this server cannot
honour (``n`` > 1, image parts...) are refused with a 400 that says so, never
silently ignored; inside our own ``speculative`` object any unknown field is an error,
because a typo there would silently change nothing."""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from localspec.engine.penalties import Penalties

Number = StrictFloat | StrictInt
MAX_SEED = (1 << 64) - 1


class SpeculativeOverride(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: StrictStr | None = None  # checked against what the server has loaded
    # the upper bounds are the engine's (one verification batch): SpecConfig.validate
    n_max: StrictInt | None = Field(default=None, ge=1)
    n_min: StrictInt | None = Field(default=None, ge=0)
    p_min: Number | None = Field(default=None, ge=0.0, le=1.0)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: StrictBool = False


def text_of(content: str | list[dict[str, Any]] | None) -> str:
    """A message's text: a string, or the concatenated text of its content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content)


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: StrictStr | None = None
    name: StrictStr | None = None

    @field_validator("content")
    @classmethod
    def text_parts_only(cls, content: Any) -> Any:
        if not isinstance(content, list):
            return content
        for part in content:
            kind = part.get("type")
            if kind != "text":
                raise ValueError(
                    f"content parts of type {kind!r} are not supported: this server's model "
                    "reads text only (send 'text' parts)"
                )
            if not isinstance(part.get("text"), str):
                raise ValueError("a 'text' content part needs a string field 'text'")
        return content

    @field_validator("tool_calls")
    @classmethod
    def calls_of_functions(cls, calls: list[dict[str, Any]] | None) -> Any:
        for i, call in enumerate(calls or []):
            function = call.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise ValueError(
                    f"tool_calls[{i}].function must be an object with a string 'name' (and "
                    "'arguments', JSON text)"
                )
            if not isinstance(function.get("arguments"), str | dict):
                raise ValueError(
                    f"tool_calls[{i}].function.arguments is missing: the call's arguments as "
                    "JSON text ('{}' for none)"
                )
        return calls

    @model_validator(mode="after")
    def content_or_tool_calls(self) -> Message:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content may be null only in an assistant message that has tool_calls")
        return self

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates expect it: text content, ``developer`` as
        ``system``, tool-call arguments as objects (OpenAI sends them as JSON text)."""
        message: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": text_of(self.content),
        }
        if self.tool_calls:
            message["tool_calls"] = [_call_for_template(call) for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message


def _call_for_template(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):  # not JSON: the template gets the text
            function["arguments"] = json.loads(arguments)
    return {**call, "function": function}


class LenientBody(BaseModel):
    """A request body as API clients send it: unknown fields ignored, and ``null`` for any
    optional field meaning its default (``"temperature": null``), as OpenAI's, Anthropic's,
    Ollama's and llama-server's APIs take it."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def null_means_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


# llama.cpp's repetition penalties, taken on every route that generates (under these names)
PENALTY_FIELDS = ("frequency_penalty", "presence_penalty", "repeat_penalty", "repeat_last_n")
NO_LIMIT = -1  # max_tokens: llama-server's "until the model ends or the context is full"


class _Common(LenientBody):
    model: StrictStr | None = None  # informational only: no model is ever loaded per request
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None  # OpenAI's newer name; wins when both
    temperature: Number = Field(default=1.0, ge=0.0, le=2.0)
    top_p: Number = Field(default=1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(default=0, ge=0)
    min_p: Number = Field(default=0.0, ge=0.0, le=1.0)
    seed: StrictInt | None = Field(default=None, ge=-1, le=MAX_SEED)  # -1: random
    stop: StrictStr | list[StrictStr] | None = None
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: Number = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: Number = Field(default=0.0, ge=-2.0, le=2.0)
    # llama-server's, which it takes on these routes too
    repeat_penalty: Number = Field(default=1.0, gt=0.0)
    repeat_last_n: StrictInt = Field(default=64, ge=-1)
    logit_bias: dict[str, Number] | None = None  # OpenAI's: token id (as text) -> bias
    speculative: SpeculativeOverride | None = None

    @field_validator(*PENALTY_FIELDS, mode="before")
    @classmethod
    def finite(cls, value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"must be a finite number (got {value})")
        return value

    @field_validator("logit_bias")
    @classmethod
    def token_biases(cls, bias: Any) -> Any:
        for key, value in (bias or {}).items():
            if not key.strip().isdecimal() or not key.strip().isascii():
                raise ValueError(f"the keys are token ids (got {key!r})")
            if not -100 <= value <= 100:
                raise ValueError(f"a bias is within [-100, 100] (got {value} for {key})")
        return bias

    @property
    def bias_entries(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(k), float(v)) for k, v in (self.logit_bias or {}).items())

    @field_validator("stop")
    @classmethod
    def no_empty_stop(cls, stop: Any) -> Any:
        if stop == "" or (isinstance(stop, list) and "" in stop):
            raise ValueError("a stop string must not be empty (leave it out, or give text)")
        return stop

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def token_limit(self) -> int | None:
        """The answer's bound, None for none: -1 is llama-server's "no limit", which its
        clients send (llama.vscode's chat edits)."""
        limit = (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else (self.max_tokens)
        )
        return None if limit == NO_LIMIT else limit

    @property
    def penalties(self) -> Penalties:
        return Penalties(
            self.repeat_penalty, self.frequency_penalty, self.presence_penalty, self.repeat_last_n
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


# a completion's prompt: text, or the model's token ids (one prompt, or a list of one)
PromptField = StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]


def one_prompt(prompt: Any) -> Any:
    """One prompt per request: a list of several prompts is refused, saying so."""
    several = isinstance(prompt, list) and prompt and not isinstance(prompt[0], int)
    if several and len(prompt) != 1:
        raise ValueError(f"one prompt per request ({len(prompt)} given): send them one at a time")
    return prompt


def prompt_ids(prompt: Any) -> tuple[int, ...] | None:
    """A prompt's token ids, where it was given as such (None: text)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and (not prompt or isinstance(prompt[0], int)):
        return tuple(prompt)
    return None


def prompt_text(prompt: Any) -> str:
    """A text prompt's text ("" for token ids)."""
    if isinstance(prompt, str):
        return prompt
    return prompt[0] if prompt and isinstance(prompt[0], str) else ""


class CompletionRequest(_Common):
    prompt: PromptField
    max_tokens: StrictInt | None = 16  # OpenAI's default for completions
    echo: StrictBool = False
    logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    best_of: StrictInt = Field(default=1, ge=1, le=1)  # one answer per request, like n
    suffix: StrictStr | None = None  # fill-in-the-middle: the text after the cursor

    _one_prompt = field_validator("prompt")(one_prompt)

    @property
    def text(self) -> str:
        return prompt_text(self.prompt)

    @property
    def tokens(self) -> tuple[int, ...] | None:
        return prompt_ids(self.prompt)

    @property
    def top_logprobs(self) -> int | None:
        return self.logprobs


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    # as llama-server: one call per answer unless asked (small models repeat a call)
    parallel_tool_calls: StrictBool = False
    response_format: dict[str, Any] | None = None

    @property
    def active_tools(self) -> list[dict[str, Any]] | None:
        """The tools the model is shown (none with ``tool_choice: none``)."""
        return self.tools if self.tools and self.tool_choice != "none" else None

    def response_schema(self) -> dict[str, Any] | None:
        """The JSON schema the answer must follow (``json_object``: any object), or None.
        Raises ValueError naming what is wrong."""
        fmt = self.response_format or {}
        kind = fmt.get("type", "text")
        if kind == "text":
            return None
        if kind == "json_object":
            schema = fmt.get("schema", {"type": "object"})  # llama-server's extension
        elif kind == "json_schema":
            spec = fmt.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if schema is None:
                raise ValueError("response_format.json_schema.schema: a JSON schema is required")
        else:
            raise ValueError(
                f"response_format type {kind!r} is not one of 'text', 'json_object', 'json_schema'"
            )
        if not isinstance(schema, dict):
            raise ValueError("response_format: the schema must be a JSON object")
        return schema

    @model_validator(mode="after")
    def top_logprobs_need_logprobs(self) -> ChatRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def wants_logprobs(self) -> int | None:
        """How many alternatives per token (0: the token's own only), None: no logprobs."""
        if not self.logprobs:
            return None
        return self.top_logprobs or 0
