"""`localspec models` (the catalog and what is on disk) and `localspec pull`."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from localspec.catalog import ModelEntry, load_catalog
from localspec.commands.pairs import hf_cache_ggufs
from localspec.progress import report_console
from localspec.sources import cache_dir, local_path

GIB = 1 << 30


def source_kind(entry: ModelEntry) -> str:
    if entry.derive is not None:
        return f"derived: {entry.derive.source} -> {entry.derive.ftype}"
    return "hub + PyPI mirror" if entry.mirror else "hub"


def run(args: argparse.Namespace) -> int:
    catalog = load_catalog()
    rows = []
    for name, entry in catalog.models.items():
        path = local_path(entry, catalog)
        size = path.stat().st_size if path else entry.size
        rows.append(
            {
                "name": name,
                "description": entry.description,
                "source": source_kind(entry),
                "size": size,
                "path": str(path) if path else None,
            }
        )
    known = {r["path"] for r in rows if r["path"]}
    others = [
        p
        for p in [*hf_cache_ggufs(), *sorted((cache_dir() / "models").glob("*.gguf"))]
        if str(p) not in known
    ]
    if args.json:
        print(
            json.dumps(
                {
                    "catalog": str(catalog.path),
                    "models": rows,
                    "other_files": [{"path": str(p), "size": p.stat().st_size} for p in others],
                },
                indent=2,
            )
        )
        return 0
    table = Table(title=f"catalog: {catalog.path}")
    for col in ("name", "size", "on disk", "source", "description"):
        table.add_column(col, overflow="fold")
    for r in rows:
        size = f"{r['size'] / GIB:.2f} GiB" if r["size"] else "?"
        where = r["path"] or "[dim]not downloaded[/]"
        table.add_row(r["name"], size, where, r["source"], r["description"])
    console = report_console()
    console.print(table)
    for p in others:
        console.print(f"also on disk: {p} ({p.stat().st_size / GIB:.2f} GiB)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("models", help="the catalog and what is on disk")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)
