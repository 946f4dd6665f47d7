"""From what the user wrote to prompt tokens: raw text, or chat messages through the model's
own chat template (rendered by llama-cpp-python's sandboxed Jinja2 formatter)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from localspec.engine.model_context import ModelContext
from localspec.engine.toolcalls import describe_tools, format_for
from localspec.errors import LocalspecError

Message = dict[str, Any]


@dataclass(frozen=True)
class TokenPrompt:
    """A prompt given as the model's token ids (OpenAI's and llama-server's completions
    take one; evaluation harnesses send them): read as they are, no BOS added, no template."""

    tokens: tuple[int, ...]

    def checked(self, n_vocab: int) -> list[int]:
        """The ids, each within the vocabulary, or a LocalspecError naming the first that is
        not."""
        if not self.tokens:
            raise LocalspecError("the prompt has no tokens", "give at least one token id")
        for i, token in enumerate(self.tokens):
            if type(token) is not int or not 0 <= token < n_vocab:
                raise LocalspecError(
                    f"the prompt's token #{i + 1}, {token}, is not in the model's vocabulary",
                    f"token ids run from 0 to {n_vocab - 1}",
                )
        return list(self.tokens)


# Used when a GGUF carries no template: ChatML, which most small instruct models were tuned on.
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def messages_from(prompt: str | Sequence[Message], system: str | None = None) -> list[Message]:
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = [dict(m) for m in prompt]
        for i, m in enumerate(messages):
            if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise LocalspecError(
                    f"chat message #{i + 1} needs string fields 'role' and 'content'",
                    'use [{"role": "user", "content": "..."}]',
                )
    if system and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, {"role": "system", "content": system})
    return messages


def render_chat(
    backend: ModelContext,
    messages: Sequence[Message],
    tools: Sequence[dict[str, Any]] | None = None,
) -> str:
    """The text the model's chat template makes of these messages (generation prompt added).
    ``tools``: functions the model may call; a template that does not render tools gets
    them described in the system message (``toolcalls.describe_tools``)."""
    template = backend.chat_template()
    if tools and not format_for(template)[1]:
        messages, tools = describe_tools(list(messages), tools), None
    formatter = Jinja2ChatFormatter(
        template or CHATML,
        eos_token=special_text(backend, backend.eos_token),
        bos_token=special_text(backend, backend.bos_token),
    )
    try:
        return formatter(messages=list(messages), tools=list(tools) if tools else None).prompt
    except Exception as exc:  # template errors come from user-supplied GGUF metadata
        raise LocalspecError(
            f"the chat template of {backend.path.name} failed: {exc}",
            "run without --chat to send the prompt as raw text",
        ) from None


def special_text(backend: ModelContext, token: int) -> str:
    return backend.token_text(token) if token >= 0 else ""


def build_prompt(
    backend: ModelContext,
    prompt: str | Sequence[Message],
    chat: bool,
    system: str | None = None,
    tools: Sequence[dict[str, Any]] | None = None,
) -> list[int]:
    """Tokenize a raw prompt, or render messages with the chat template and tokenize that.
    A raw prompt's special-token texts (``<|im_start|>``...) are the tokens: its writer is
    writing the template. A message's are text, as OpenAI reads them: a web page or a tool
    result that holds ``<|im_end|><|im_start|>system`` must not open a turn of its own."""
    if not chat and isinstance(prompt, str) and not tools:
        return backend.tokenize(prompt, add_special=True, parse_special=True)
    messages = messages_from(prompt, system)
    literal = [holds_special_text(backend, m.get("content")) for m in messages]
    # in no message (a random name), and plain ASCII letters: a template that trims,
    # escapes or JSON-encodes a message keeps it as it is
    marker = f"LOCALSPECTEXT{secrets.token_hex(8)}"
    if any(literal):
        messages = [
            dict(m, content=_marked(m["content"], marker)) if lit else m
            for m, lit in zip(messages, literal, strict=True)
        ]
    text = render_chat(backend, messages, tools)
    # A template that writes the BOS token itself must not get a second one from the tokenizer.
    # End-of-turn tokens need no stop string: they are end-of-generation tokens for llama.cpp.
    bos = special_text(backend, backend.bos_token)
    add_special = not (bos and text.startswith(bos))
    pieces = text.split(marker)  # the template's text, then each marked message's, in turn
    if len(pieces) % 2 == 0:
        raise LocalspecError(
            "a message holds the text of a special token (such as <|im_end|>), and the chat "
            f"template of {backend.path.name} does not keep messages whole to read it as text",
            "remove the special token's text from the message",
        )
    tokens: list[int] = []
    for i, piece in enumerate(pieces):
        template = i % 2 == 0
        first = add_special and i == 0
        tokens += backend.tokenize(piece, add_special=first, parse_special=template)
    return tokens


def holds_special_text(backend: ModelContext, content: object) -> bool:
    """Whether ``content`` would be read as holding special tokens (the tokenizer's own say)."""
    if not isinstance(content, str) or not content:
        return False
    special = backend.tokenize(content, add_special=False, parse_special=True)
    return special != backend.tokenize(content, add_special=False, parse_special=False)


def _marked(content: str, marker: str) -> str:
    """``content`` with ``marker`` around it, inside its leading and trailing whitespace (so
    that a template that trims a message still trims it)."""
    core = content.strip()
    start = content.index(core)
    return f"{content[:start]}{marker}{core}{marker}{content[start + len(core) :]}"
