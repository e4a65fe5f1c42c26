"""``WeightPull``: a vLLM worker extension through which a vLLM server takes the trainer's
weights over the network, with no file system in common.

Start the server with it (turnrl installed beside vLLM)::

    VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model MODEL \\
        --worker-extension-cls turnrl.serving.vllm_worker.WeightPull ...

and the trainer (``agent.http.weight_transport=http``, ``turnrl.policies.weight_push``) makes
each push with ``POST /collective_rpc`` ``{"method": "turnrl_pull_weights", "kwargs": {"url",
"token", "sha256", "size"}}``: every worker fetches the push's ``model.safetensors`` from the
trainer's URL (``Authorization: Bearer TOKEN``), and loads it only after every check passed:

1. the bytes received are ``size`` long and hash to ``sha256``;
2. they parse as safetensors, and every tensor is finite;
3. names and shapes are exactly the served checkpoint's (read from the headers of the
   ``*.safetensors`` files in the folder the server was started on; a tied ``lm_head.weight``
   may come or not);

then ``Worker.reload_weights(weights_iterator=...)`` loads them in place (vLLM's own in-place
reload: its kernels' packed copies of the weights are made again). ``turnrl_load_folder(path)``
does the same from a folder on the server's own file system (``weight_transport=folder``), and
says so when the folder is not there.

A failure of any kind is returned, never raised: an exception out of a worker's RPC can end
vLLM's engine (a server that then answers nothing but errors), while a returned failure leaves
the server serving the weights it had. Each method returns a dict: ``{"ok": true, "tensors",
"bytes", "seconds"}`` or ``{"ok": false, "error": "..."}``.

This module is imported inside vLLM's worker processes: it needs only torch, safetensors and
httpx.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

__all__ = ["PULL_METHOD", "FOLDER_METHOD", "WeightPull", "check_weights", "checkpoint_shapes", "fetch"]

PULL_METHOD = "turnrl_pull_weights"
"""The ``collective_rpc`` method that fetches a push over HTTP."""
FOLDER_METHOD = "turnrl_load_folder"
"""The ``collective_rpc`` method that loads a push from a folder the server sees."""
FETCH_TIMEOUT_S = 600.0
"""Seconds a fetch may take in all (connect, then the whole body)."""
_TIED = "lm_head.weight"


def checkpoint_shapes(folder: str | os.PathLike) -> dict[str, tuple[int, ...]] | None:
    """``{name: shape}`` of every tensor in ``folder``'s ``*.safetensors`` files (headers only,
    no tensor is read), or None when ``folder`` is not a local folder holding any."""
    from safetensors import safe_open

    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def check_weights(state: dict, expected: dict[str, tuple[int, ...]] | None) -> str | None:
    """What is wrong with ``state`` (``{name: tensor}``) for a model whose checkpoint holds
    ``expected`` (None: unknown, names and shapes not checked), or None when nothing is: a name
    the model does not have, a missing or reshaped tensor (a tied ``lm_head.weight`` may be
    absent, or present while the checkpoint leaves it out), a NaN or inf value."""
    import torch

    problems = []
    if expected is not None:
        allowed = set(expected) | {_TIED}
        unknown = sorted(set(state) - allowed)
        missing = sorted(n for n in expected if n not in state and n != _TIED)
        shaped = sorted(n for n, t in state.items() if n in expected and tuple(t.shape) != expected[n])
        tied = _TIED in state and _TIED not in expected and "model.embed_tokens.weight" in expected and \
            tuple(state[_TIED].shape) != expected["model.embed_tokens.weight"]
        for what, names in (("unknown names", unknown), ("missing", missing), ("other shapes", shaped),
                            ("other shapes", [_TIED] if tied else [])):
            if names:
                problems.append(f"{what}: {names[:3]}{' ...' if len(names) > 3 else ''}")
    not_finite = sorted(n for n, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all()))
    if not_finite:
        problems.append(f"NaN or inf values: {not_finite[:3]}")
    return "; ".join(problems) or None


class WeightPull:
    """The worker extension (see the module docstring). vLLM mixes it into its worker class, so
    ``self`` is a vLLM worker (``self.vllm_config``, ``self.reload_weights``)."""

    def turnrl_pull_weights(self, url: str, token: str = "", sha256: str = "", size: str = "") -> dict:
        """Fetch ``url`` (a ``model.safetensors``), check it and load it; never raises."""
        started = time.perf_counter()
        try:
            data = fetch(url, token, int(size) if size else None)
            if sha256 and hashlib.sha256(data).hexdigest() != sha256:
                return _failed(f"the bytes fetched from {url} do not hash to the sha256 sent ({sha256[:16]}...): "
                               "the transfer was corrupted or the push replaced meanwhile; push again")
            from safetensors.torch import load as load_safetensors

            try:
                state = load_safetensors(bytes(data))
            except Exception as e:  # noqa: BLE001 - not safetensors
                return _failed(f"the bytes fetched from {url} are not a safetensors file: {type(e).__name__}: {e}")
            return self._turnrl_load(state, len(data), started)
        except BaseException as e:  # noqa: BLE001 - a raise here could end the engine
            return _failed(f"{type(e).__name__}: {e}")

    def turnrl_load_folder(self, path: str) -> dict:
        """Load the ``*.safetensors`` of ``path`` (a folder on this server's file system);
        never raises."""
        started = time.perf_counter()
        try:
            from safetensors.torch import load_file

            folder = Path(path)
            files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
            if not files:
                return _failed(f"{path} is not a folder holding *.safetensors files on the server's file system "
                               "(hostname " + os.uname().nodename + "): the trainer's weights folder must be shared "
                               "at the same path, or push over the network (agent.http.weight_transport=http)")
            state, size = {}, 0
            for file in files:
                state.update(load_file(str(file)))
                size += file.stat().st_size
            return self._turnrl_load(state, size, started)
        except BaseException as e:  # noqa: BLE001 - a raise here could end the engine
            return _failed(f"{type(e).__name__}: {e}")

    def _turnrl_load(self, state: dict, size: int, started: float) -> dict:
        expected = self._turnrl_expected()
        problem = check_weights(state, expected)
        if problem is not None:
            return _failed(f"the pushed weights do not fit the served model ({problem}); nothing was loaded, the "
                           "server keeps serving its weights")
        self.reload_weights(weights_iterator=iter(list(state.items())))
        return {"ok": True, "tensors": len(state), "bytes": size, "seconds": time.perf_counter() - started}

    def _turnrl_expected(self) -> dict[str, tuple[int, ...]] | None:
        """The served checkpoint's names and shapes, read once (None: not a local folder)."""
        if not hasattr(self, "_turnrl_shapes"):
            self._turnrl_shapes = checkpoint_shapes(self.vllm_config.model_config.model)
        return self._turnrl_shapes


def fetch(url: str, token: str, size: int | None) -> bytearray:
    """The body of ``GET url``, at most ``size`` bytes when given (more is an error)."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = bytearray()
    with httpx.stream("GET", url, headers=headers, timeout=httpx.Timeout(FETCH_TIMEOUT_S, connect=10.0),
                      trust_env=False) as response:
        if response.status_code != 200:
            raise RuntimeError(f"GET {url} answered HTTP {response.status_code}: {response.read()[:200]!r}")
        for chunk in response.iter_bytes(1 << 20):
            data += chunk
            if size is not None and len(data) > size:
                raise RuntimeError(f"GET {url} sent more than the {size} bytes announced")
    if size is not None and len(data) != size:
        raise RuntimeError(f"GET {url} sent {len(data)} bytes, {size} were announced (a cut transfer)")
    return data


def _failed(error: str) -> dict:
    return {"ok": False, "error": error}

