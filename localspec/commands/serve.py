"""`localspec serve`: load once, then serve the OpenAI-compatible API with uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator

import uvicorn

from localspec import argtypes as at
from localspec.commands.flags import add_memory_flags, add_model_flags, add_spec_flags, load_engine
from localspec.errors import LocalspecError
from localspec.server.guard import is_loopback_host

# How long a stopping server waits for its generation thread to leave the engine (it stops
# after its current round; a long prompt's evaluation is the longest step there is).
STOP_WAIT_S = 60.0
# parallel slots by default: chat UIs and agents send several requests at once, and on this
# project's reference 2-core machine four in one batch more than double a lone request's
# throughput (docs/benchmarks.md); each slot costs a context of -c tokens
DEFAULT_PARALLEL = 4
# How long a stopping server waits for open connections (an answer's last round, a reply a
# slow client is still reading; one still sending its body is answered 503 at once) before
# closing them: a supervisor (docker stop, systemd) kills a process that takes longer than
# 10 s, before the memory is saved.
CONNECTIONS_WAIT_S = 5.0


class GracefulServer(uvicorn.Server):
    """SIGINT/SIGTERM: stop the running generation after its round (``on_stop``), finish,
    free the models, exit 0 (plain uvicorn re-raises the signal after shutting down, so the
    process would die of it before the engine is freed; and it waits for every open request
    to end, however long its answer)."""

    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_stop = on_stop

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        def stop(_sig: int, _frame: object) -> None:
            if self.should_exit:  # a second signal: do not wait for open requests
                self.force_exit = True
            self.should_exit = True
            self.on_stop()

        previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


class CancelledAtExit(logging.Filter):
    """A forced stop (a second Ctrl-C) cancels the requests still open, and uvicorn reports
    each as an exception in the application, with its traceback: it is not one."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError))


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads: a taken port or a host that is
    not this machine's fails at once, with one clear line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise LocalspecError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            "pick another --port (0: any free one), stop the program using it, or check --host",
        ) from None
    except (TypeError, ValueError) as exc:  # a host no resolver takes (a NUL, bad IDNA)
        sock.close()
        raise LocalspecError(
            f"--host {host!r} is not a host name or address: {exc}",
            "give an address such as 127.0.0.1 or a host name",
        ) from None
    sock.set_inheritable(True)
    return sock


def run(args: argparse.Namespace) -> int:
    from localspec.server.app import ServerSettings, create_app

    listening = bind_socket(args.host, args.port)
    loopback = is_loopback_host(args.host)
    if not loopback and not args.api_keys:
        print(
            f"localspec: warning: listening on {args.host} without --api-key: anyone who "
            "can reach this port can use the model",
            file=sys.stderr,
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    with listening, load_engine(args) as engine:
        engine.warm_up()  # the batch costs measured now, not in the first client's wait
        settings = ServerSettings(
            api_keys=tuple(args.api_keys or ()),
            max_queue=args.max_queue,
            allowed_origins=args.allowed_origins,
            loopback_hosts_only=loopback,
            model_names=(args.target,) if args.target else (),
        )
        app = create_app(engine, settings)
        runner = app.state.server.runner
        print(
            f"localspec: serving {engine.target_path.name} ({engine.mode}, "
            f"{engine.parallel} slot{'s' if engine.parallel > 1 else ''}) on "
            f"http://{args.host}:{listening.getsockname()[1]}/v1",
            file=sys.stderr,
            flush=True,
        )
        # no lifespan events: the app has none, and a forced stop would report theirs cancelled
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=CONNECTIONS_WAIT_S,
        )
        logging.getLogger("uvicorn.error").addFilter(CancelledAtExit())
        GracefulServer(config, runner.stop).run(sockets=[listening])
        if not runner.wait_idle(STOP_WAIT_S):  # freeing the engine under it would crash
            engine.memories.save()
            print("localspec: stopped (the generation did not end in time)", file=sys.stderr)
            os._exit(1)
    print("localspec: stopped", file=sys.stderr)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "serve",
        help="HTTP server: OpenAI (chat, completions, responses), Anthropic Messages, Ollama and "
        "llama.cpp (/infill) routes",
    )
    add_model_flags(p)
    add_spec_flags(p)
    add_memory_flags(p, on_by_default=True)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=at.port, default=8080, help="port (default 8080; 0: any free)")
    p.add_argument(
        "--api-key",
        dest="api_keys",
        action="append",
        type=at.text,
        default=None,
        help="require Authorization: Bearer KEY or x-api-key: KEY (also for /metrics); "
        "repeat it for several users: each key has its own speculation memory",
    )
    p.add_argument(
        "--allowed-origins",
        type=at.origins,
        default=(),
        metavar="ORIGINS",
        help="web origins that may call the API besides loopback ones, comma-separated "
        "(e.g. https://app.example.com; *: any)",
    )
    p.add_argument(
        "-np",
        "--parallel",
        type=at.slots,
        default=None,
        help="generations answered at once, verified in one batch per step; each has a "
        f"context of -c tokens (default {DEFAULT_PARALLEL}; 1 with draft-mtp)",
    )
    p.add_argument(
        "--cache-ram",
        type=at.non_negative,
        default=None,
        metavar="MIB",
        help="host memory for prompts' caches once their slot moved on, given back to a "
        "request that starts the same way (default 1024; 0: none)",
    )
    p.add_argument(
        "--max-queue",
        type=at.non_negative,
        default=8,
        help="requests that may wait for the engine before 429 (default 8)",
    )
    p.set_defaults(handler=run, default_parallel=DEFAULT_PARALLEL)
