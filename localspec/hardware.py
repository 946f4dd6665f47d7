"""What this machine offers: cores and memory (psutil)."""

from __future__ import annotations

import os

import psutil


def default_threads() -> int:
    """Physical cores: llama.cpp decoding is memory-bound and gains nothing from SMT siblings."""
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def available_memory() -> int:
    return int(psutil.virtual_memory().available)
