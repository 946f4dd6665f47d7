"""Who may talk to a local server: a web page must not be able to drive it, as Ollama does.

Any web page the user opens can send a "simple" cross-origin POST (``text/plain`` or a form
body, no preflight) to ``http://127.0.0.1:8080``, and a DNS-rebinding page can even read the
answers (its own host name resolves to 127.0.0.1). So, by default:

- a request that carries an ``Origin`` header must come from a loopback origin, or from one
  listed with ``--allowed-origins`` (``*``: any);
- while the server listens on a loopback address, the ``Host`` header must name a loopback
  host (a rebinding page's host name does not); listening on another address is a choice to
  be reached by other names, and then ``--api-key`` is what protects it;
- request bodies must be JSON (``Content-Type: application/json``, or none): ``text/plain``,
  multipart and form bodies, the ones browsers send without asking, get a 415 (a form type
  without an ``Origin`` header is what ``curl -d`` sends, and is read as JSON).

The pages that may call it get the CORS headers a browser asks for (``OriginCORS``): without
them, a web app on ``http://localhost:3000`` could send a request but not read the answer,
and its preflight (any request with an ``Authorization`` header or a JSON body) would fail.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

LOOPBACK_NAMES = ("localhost",)


def is_loopback_host(host: str) -> bool:
    """``localhost``, ``*.localhost``, or a loopback IP address (v4 or v6, brackets allowed)."""
    host = host.strip().lower().rstrip(".")
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_of(header: str) -> str:
    """The host part of a ``Host`` header (``[::1]:8080`` -> ``::1``)."""
    return urlsplit(f"//{header}").hostname or ""


def origin_allowed(origin: str, allowed: Sequence[str]) -> bool:
    if "*" in allowed or origin in allowed:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and is_loopback_host(parts.hostname or "")


def body_type_allowed(content_type: str | None, origin: str | None) -> bool:
    """JSON (or no type at all). ``curl -d`` labels its JSON as a form, and curl sends no
    ``Origin``, while a browser always does: a form type is accepted only without one."""
    if not content_type:
        return True
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json")):
        return True
    return kind == "application/x-www-form-urlencoded" and origin is None


class OriginCORS(CORSMiddleware):
    """CORS for exactly the origins ``origin_allowed`` accepts: preflights answered, answers
    readable, any request header (``Authorization``, the SDKs' own)."""

    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        super().__init__(app, allow_methods=["GET", "POST"], allow_headers=["*"], max_age=600)
        self.allowed = tuple(allowed)

    def is_allowed_origin(self, origin: str) -> bool:
        return origin_allowed(origin, self.allowed)
