"""What the ``turnrl`` commands share: exit codes, the argument types of the parser, and
``serve_until_signalled`` (the servers' lifecycle). Light: the standard library only."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# build-model's choices, as in turnrl.models.tiny_checkpoints (not imported here: it loads torch)
MODEL_ARCHS = {"qwen2": "qwen2_5", "qwen3": "qwen3", "llama": "llama3_1", "gemma3": "gemma3"}


def serve_until_signalled(server, command: str, args: argparse.Namespace, banner: str) -> int:
    """Start ``server``, print ``banner`` (``{url}`` filled in) as one flushed line, serve until
    SIGINT/SIGTERM, stop; 0 on a clean stop, 1 when the address cannot be bound."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server.start()
    except OSError as e:
        print(f"turnrl {command}: error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return EXIT_FAILED
    try:
        print(banner.format(url=server.url), flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
    return EXIT_OK


def _kwarg(text: str) -> tuple[str, Any]:
    """``key=value`` -> ``(key, value)``, the value parsed as JSON when possible."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, e.g. n=16, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0..65535 (0: any free port), got {text!r}")
    return value
