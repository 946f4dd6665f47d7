"""From what the user wrote to prompt tokens: raw text, or chat messages through the model's
own chat template (rendered by llama-cpp-python's sandboxed Jinja2 formatter)."""

from __future__ import annotations

from collections.abc import Sequence

from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from localspec.engine.backend import Backend
from localspec.errors import LocalspecError

Message = dict[str, str]

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


def render_chat(backend: Backend, messages: Sequence[Message]) -> str:
    """The text the model's chat template makes of these messages (generation prompt added)."""
    formatter = Jinja2ChatFormatter(
        backend.chat_template() or CHATML,
        eos_token=special_text(backend, backend.eos_token),
        bos_token=special_text(backend, backend.bos_token),
    )
    try:
        return formatter(messages=list(messages)).prompt
    except Exception as exc:  # template errors come from user-supplied GGUF metadata
        raise LocalspecError(
            f"the chat template of {backend.path.name} failed: {exc}",
            "run without --chat to send the prompt as raw text",
        ) from None


def special_text(backend: Backend, token: int) -> str:
    return backend.token_text(token) if token >= 0 else ""


def build_prompt(
    backend: Backend, prompt: str | Sequence[Message], chat: bool, system: str | None = None
) -> list[int]:
    """Tokenize a raw prompt, or render messages with the chat template and tokenize that."""
    if not chat and isinstance(prompt, str):
        return backend.tokenize(prompt, add_special=True, parse_special=True)
    text = render_chat(backend, messages_from(prompt, system))
    # A template that writes the BOS token itself must not get a second one from the tokenizer.
    # End-of-turn tokens need no stop string: they are end-of-generation tokens for llama.cpp.
    bos = special_text(backend, backend.bos_token)
    add_special = not (bos and text.startswith(bos))
    return backend.tokenize(text, add_special=add_special, parse_special=True)
