"""Request bodies (pydantic) and the OpenAI-shaped error they produce when wrong.

Top-level fields that OpenAI clients commonly send but that change nothing here (``user``,
zero penalties, ``stream_options``...) are accepted and ignored; values this server cannot
honour (``n`` > 1, logprobs...) are refused, and inside our own ``speculative`` object any
unknown field is an error, because a typo there would silently change nothing."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

Number = StrictFloat | StrictInt


class SpeculativeOverride(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: StrictStr | None = None  # checked against what the server has loaded
    n_max: StrictInt | None = Field(default=None, ge=1, le=256)
    n_min: StrictInt | None = Field(default=None, ge=0, le=256)
    p_min: Number | None = Field(default=None, ge=0.0, le=1.0)


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant"]
    content: StrictStr


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None  # informational only: no model is ever loaded per request
    max_tokens: StrictInt | None = None
    temperature: Number = Field(default=1.0, ge=0.0, le=2.0)
    top_p: Number = Field(default=1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(default=0, ge=0)
    min_p: Number = Field(default=0.0, ge=0.0, le=1.0)
    seed: StrictInt | None = Field(default=None, ge=-1, le=(1 << 64) - 1)  # -1: random
    stop: StrictStr | list[StrictStr] | None = None
    n: StrictInt = 1
    stream: StrictBool = False
    logprobs: StrictBool | StrictInt | None = None
    speculative: SpeculativeOverride | None = None

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(_Common):
    prompt: StrictStr
    max_tokens: StrictInt | None = 16  # OpenAI's default for completions


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
