"""llama-server's own utility endpoints, as the UIs and tools that read them expect:
``/tokenize`` (with ``with_pieces``), ``/detokenize``, ``/apply-template`` and ``/props``.

They answer from the vocabulary and the chat template alone (read-only, no turn in the
queue), behind the same guards as the generation endpoints; bad input is a 400 in the shape
every other endpoint uses."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from localspec import __version__
from localspec.engine.prompting import render_chat
from localspec.errors import LocalspecError
from localspec.server.completion_routes import LlamaCompletionBody
from localspec.server.host import RouteHost
from localspec.server.schemas import Message
from localspec.server.shapes import ApiError

SAMPLING_DEFAULTS = ("n_predict", "temperature", "top_k", "top_p", "min_p")

if TYPE_CHECKING:
    pass


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    content: StrictStr
    add_special: StrictBool = False
    parse_special: StrictBool = True
    with_pieces: StrictBool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tokens: list[StrictInt]


class ApplyTemplateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None


class LlamaRoutes:
    def __init__(self, server: RouteHost) -> None:
        self.server = server
        self.engine = server.engine

    async def _request(self, request: Request, model: type[BaseModel]) -> Any:
        self.server.check_caller(request)
        return self.server.parse_body(model, await self.server.read_json(request))

    async def tokenize(self, request: Request) -> Response:
        try:
            req: TokenizeRequest = await self._request(request, TokenizeRequest)
            target = self.engine.target
            tokens = target.tokenize(req.content, req.add_special, req.parse_special)
        except ApiError as exc:
            return exc.response()
        if not req.with_pieces:
            return JSONResponse({"tokens": tokens})
        return JSONResponse(
            {"tokens": [{"id": t, "piece": _piece(target.piece(t))} for t in tokens]}
        )

    async def detokenize(self, request: Request) -> Response:
        try:
            req: DetokenizeRequest = await self._request(request, DetokenizeRequest)
            n_vocab = self.engine.target.n_vocab
            bad = next((t for t in req.tokens if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise ApiError(
                    400, f"token {bad} is not in the vocabulary (0..{n_vocab - 1})", param="tokens"
                )
        except ApiError as exc:
            return exc.response()
        return JSONResponse({"content": self.engine.target.detokenize(req.tokens)})

    async def apply_template(self, request: Request) -> Response:
        try:
            req: ApplyTemplateRequest = await self._request(request, ApplyTemplateRequest)
            messages = [m.for_template() for m in req.messages]
            try:
                prompt = render_chat(self.engine.target, messages, req.tools)
            except LocalspecError as exc:
                raise ApiError(400, exc.message, param="messages") from None
        except ApiError as exc:
            return exc.response()
        return JSONResponse({"prompt": prompt})

    async def props(self, request: Request) -> Response:
        try:
            self.server.check_caller(request)
        except ApiError as exc:
            return exc.response()
        target = self.engine.target
        # what /completion and /infill use when a field is left out (llama-server's own
        # defaults, which clients reading /props expect; the OpenAI routes keep OpenAI's)
        fields = LlamaCompletionBody.model_fields
        return JSONResponse(
            {
                "default_generation_settings": {
                    "n_ctx": target.n_ctx,
                    "params": {
                        **{k: fields[k].default for k in SAMPLING_DEFAULTS},
                        "speculative.type": self.engine.mode,
                        "speculative.n_max": self.engine.spec.n_max,
                    },
                },
                "total_slots": self.engine.parallel,
                "model_alias": self.server.model_id,
                "model_path": str(self.engine.target_path),
                "chat_template": target.chat_template() or "",
                "bos_token": _special(target, target.bos_token),
                "eos_token": _special(target, target.eos_token),
                "modalities": {"vision": False, "audio": False},
                "build_info": f"localspec {__version__}",
            }
        )


def _piece(raw: bytes) -> str | list[int]:
    """A token's text, or its bytes where they are not whole UTF-8 (as llama-server)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def _special(target: Any, token: int) -> str:
    return target.token_text(token) if token >= 0 else ""
