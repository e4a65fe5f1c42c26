"""Weight pushes over the network: ``WeightPublisher`` serves the trainer's latest push for the
rollout servers to fetch, so trainer and servers need no file system in common.

A push (``ServedPolicy.load_weights`` with ``agent.http.weight_transport=http``) writes the
learner's weights as ``model.safetensors`` in the trainer's own run dir, publishes that file
here (``publish``: its URL, sha256 and size), then asks every server to fetch it
(``OpenAIPolicy.load_weights_from_url``: vLLM through the worker extension
``turnrl.serving.vllm_worker.WeightPull``, ``turnrl serve-policy`` natively). The server checks
size, hash, format, names, shapes and finiteness before it loads anything, and answers a
failure instead of dying, so a bad push leaves it serving the weights it had.

The publisher is a turnrl HTTP service (FastAPI under uvicorn) bound to the address the servers
reach the trainer at (``reach_address``): ``GET /weights/N/model.safetensors`` answers push
``N``'s file while it is the latest (an older one is 410: a newer push replaced it), and needs
``Authorization: Bearer TOKEN`` (a random token made per publisher, sent to the servers with
each push; only ``/health`` is open).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from fastapi import FastAPI
from fastapi.responses import FileResponse

from turnrl.serving import APIError, HTTPService, service_app

__all__ = ["Published", "WeightPublisher", "reach_address"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Published:
    """One push as the servers fetch it."""

    url: str  # GET it with the token
    token: str
    sha256: str  # of the file's bytes
    size: int  # bytes


class WeightPublisher(HTTPService):
    """Serve the latest published weights file (see the module docstring).

    Args:
        host: the interface to bind: the address the servers reach this machine at
            (``reach_address``); ``0.0.0.0`` for all.
        port: TCP port; 0 picks a free one.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port, "weight-publisher", token=secrets.token_urlsafe(24), max_threads=16)
        self._lock = threading.Lock()
        self._current: tuple[int, Path] | None = None
        self._pushes = 0

    def build_app(self) -> FastAPI:
        app = service_app(title="weight publisher", token=self._token, max_body_bytes=1 << 10,
                          endpoints="GET /weights/N/model.safetensors, GET /health", logger=log)

        @app.get("/weights/{push}/model.safetensors")
        async def weights(push: int) -> FileResponse:
            with self._lock:
                current = self._current
            if current is None or current[0] != push:
                raise APIError(410 if current is not None and push < current[0] else 404,
                               f"push {push} is not the latest (latest: {current[0] if current else 'none'}); a "
                               "newer push replaced it")
            return FileResponse(current[1], media_type="application/octet-stream")

        return app

    def publish(self, file: str | Path) -> Published:
        """Serve ``file`` (a ``model.safetensors``) as the next push, in place of the one before.

        Raises:
            RuntimeError: If the publisher is not started.
            FileNotFoundError: If ``file`` is not a file.
        """
        if not self.running:
            raise RuntimeError("the weight publisher is not started: start() it first")
        file = Path(file)
        if not file.is_file():
            raise FileNotFoundError(f"{file} is not a file: save the weights before publishing them")
        digest = hashlib.sha256()
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        with self._lock:
            self._pushes += 1
            self._current = (self._pushes, file)
            push = self._pushes
        return Published(f"{self.url}/weights/{push}/model.safetensors", self._token, digest.hexdigest(),
                         file.stat().st_size)


def reach_address(server_urls: list[str]) -> str:
    """The local address the servers at ``server_urls`` reach this machine at: the source address
    the operating system picks for a route to each (no packet is sent). All on loopback gives
    ``127.0.0.1``; servers reached over different interfaces give ``0.0.0.0`` (bind every
    interface; the publisher's token still guards it).

    Raises:
        ValueError: If a URL has no host, or no route to it exists.
    """
    addresses = set()
    for url in server_urls:
        parts = urlsplit(url)
        if not parts.hostname:
            raise ValueError(f"{url!r} has no host: rollout server URLs look like http://HOST:PORT")
        try:
            infos = socket.getaddrinfo(parts.hostname, parts.port or 80, type=socket.SOCK_DGRAM)
            family, _, _, _, address = infos[0]
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(address)
                addresses.add(s.getsockname()[0])
        except OSError as e:
            raise ValueError(f"no route from this machine to the rollout server {url}: {e}") from e
    if len(addresses) == 1:
        return addresses.pop()
    return "0.0.0.0"
