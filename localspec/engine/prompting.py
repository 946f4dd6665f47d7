"""From what the user wrote to prompt tokens: raw text, or chat messages through the model's
own chat template (rendered by llama-cpp-python's sandboxed Jinja2 formatter)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from localspec.engine.model_context import ModelContext
from localspec.engine.toolcalls import describe_tools, format_for
from localspec.errors import LocalspecError

Message = dict[str, Any]

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
    """Tokenize a raw prompt, or render messages with the chat template and tokenize that."""
    if not chat and isinstance(prompt, str) and not tools:
        return backend.tokenize(prompt, add_special=True, parse_special=True)
    text = render_chat(backend, messages_from(prompt, system), tools)
    # A template that writes the BOS token itself must not get a second one from the tokenizer.
    # End-of-turn tokens need no stop string: they are end-of-generation tokens for llama.cpp.
    bos = special_text(backend, backend.bos_token)
    add_special = not (bos and text.startswith(bos))
    return backend.tokenize(text, add_special=add_special, parse_special=True)
