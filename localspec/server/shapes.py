"""OpenAI's shapes for what the server sends back: errors, usage, and localspec's
``speculative`` and llama-server's ``timings`` objects."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.responses import JSONResponse

from localspec.engine.stats import Stats


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.param, self.code, self.headers = param, code, headers

    def body(self) -> dict[str, Any]:
        """OpenAI's error object: the same in a JSON response and in a stream's error event."""
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def in_terms_of(
    exc: ApiError, names: dict[str, str], phrases: Sequence[tuple[str, str]] = ()
) -> ApiError:
    """An error about a field of the chat request another API's request was translated
    into, named as that API names it: ``names`` maps the chat request's top field to that
    API's (``max_tokens`` to ``options.num_predict``), ``phrases`` rewrite the message."""
    param, message = exc.param, exc.message
    if param:
        head, dot, rest = param.partition(".")
        if head in names:
            renamed = f"{names[head]}{dot}{rest}"
            if message.startswith(param):
                message = renamed + message[len(param) :]
            param = renamed
    for old, new in phrases:
        message = message.replace(old, new)
    if (param, message) == (exc.param, exc.message):
        return exc
    return ApiError(exc.status, message, exc.kind, param, exc.code, exc.headers)


def speculative_block(stats: Stats, mode: str) -> dict[str, Any]:
    return {
        "mode": mode,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "mean_acceptance_length": round(stats.mean_acceptance_length, 4),
        "acceptance_per_position": [round(a, 4) for a in stats.acceptance_per_position],
        "draft_ms": round(stats.draft_ms, 3),
        "verify_ms": round(stats.verify_ms, 3),
        "paused": stats.paused,
        "by_drafter": stats.by_drafter_dict(),
    }


def timings_block(stats: Stats) -> dict[str, Any]:
    """llama-server's ``timings`` object, with its field names."""
    prompt_n = stats.n_prompt - stats.n_cached
    return {
        "cache_n": stats.n_cached,  # read from the cache: prompt_n counts those read now
        "prompt_n": prompt_n,
        "prompt_ms": round(stats.prefill_ms, 3),
        # the per-token figures editors show (llama.vim's and llama.vscode's info line);
        # 0 where nothing was counted (JSON has no infinity)
        "prompt_per_token_ms": _per(stats.prefill_ms, prompt_n),
        "prompt_per_second": _per(1000.0 * prompt_n, stats.prefill_ms),
        "predicted_n": stats.n_tokens,
        "predicted_ms": round(stats.gen_ms, 3),
        "predicted_per_token_ms": _per(stats.gen_ms, stats.n_tokens),
        "predicted_per_second": round(stats.tokens_per_s, 3),
        "draft_n": stats.drafted,
        "draft_n_accepted": stats.accepted,
    }


def _per(amount: float, count: float) -> float:
    return round(amount / count, 3) if count > 0 else 0.0


def usage_block(stats: Stats) -> dict[str, int]:
    return {
        "prompt_tokens": stats.n_prompt,
        "completion_tokens": stats.n_tokens,
        "total_tokens": stats.n_prompt + stats.n_tokens,
    }
