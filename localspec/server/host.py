"""What the routes of each API family (``llama_routes``, ``completion_routes``,
``anthropic_routes``, ``ollama_routes``) use of the server (``app.Server``): its guards, its
request parsing and checks, its queue, and what a reply reports to it. A protocol, so that
those modules need not import the app that imports them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from localspec.server.reply import ReplyHost

if TYPE_CHECKING:
    from localspec.api import Engine, Prompt
    from localspec.engine.toolcalls import ToolFormat
    from localspec.server.runner import GenerationStream
    from localspec.server.schemas import ChatRequest, CompletionRequest


class ServedNames(Protocol):
    @property
    def model_names(self) -> tuple[str, ...]: ...


class RouteHost(ReplyHost, Protocol):
    engine: Engine
    model_id: str
    settings: ServedNames
    tool_format: ToolFormat

    def check_caller(self, request: Request) -> str: ...

    async def read_json(self, request: Request) -> Any: ...

    def parse_body(self, model: type[BaseModel], data: Any) -> Any: ...

    def parse(self, model: type[ChatRequest] | type[CompletionRequest], data: Any) -> Any: ...

    def generation_args(
        self,
        req: ChatRequest | CompletionRequest,
        partition: str,
        prompt: Prompt | None = None,
    ) -> dict[str, Any]: ...

    async def start(self, request: Request, args: dict[str, Any]) -> GenerationStream: ...


Handler = Callable[[Request], Awaitable[Response]]


def counted_route(host: ReplyHost, path: str, handler: Handler, **options: Any) -> Route:
    """A route that reads no generation (models, tokens, props...), counted in the metrics'
    requests by the status it answered with; a generation's routes count themselves, once
    it has ended (499: the client left)."""

    async def answer(request: Request) -> Response:
        response = await handler(request)
        host.ended(path, response.status_code)
        return response

    return Route(path, answer, **options)
