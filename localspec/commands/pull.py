"""`localspec pull`: download a model (a catalog name or REPO[:FILE]) into the caches."""

from __future__ import annotations

import argparse
from pathlib import Path

from localspec.sources import pull


def run(args: argparse.Namespace) -> int:
    path: Path = pull(args.ref)
    print(path)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("pull", help="download a model (catalog name or REPO[:FILE])")
    p.add_argument("ref", help="a catalog name, or a Hugging Face repo id with :FILE")
    p.set_defaults(handler=run)
