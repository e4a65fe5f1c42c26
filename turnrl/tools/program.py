"""What a code tool asks an executor to run: ``Program`` (argv, files, stdin), checked to be text a
sandbox can take (``BadProgram`` says what is not)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BadProgram", "Program", "bad_text"]


@dataclass(frozen=True)
class Program:
    """What a code tool asks an executor to run: ``argv`` inside a private, writable working
    directory that holds ``files`` (relative path -> text) before the run; ``stdin`` is fed in.

    Raises:
        ValueError: If ``argv`` is empty, or a file path is absolute or leaves the working
            directory (``..``).
        BadProgram: If any text is not valid Unicode (a lone surrogate), or an ``argv`` item
            or a path holds a NUL character; the message says which.
    """

    argv: tuple[str, ...]
    files: Mapping[str, str] = field(default_factory=dict)
    stdin: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.argv, str) or not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise ValueError(
                f"Program.argv must be a non-empty tuple of str, e.g. ('python3', 'main.py'), got {self.argv!r}")
        object.__setattr__(self, "argv", tuple(self.argv))
        for path, text in self.files.items():
            parts = str(path).replace("\\", "/").split("/")
            if not path or str(path).startswith("/") or ".." in parts:
                raise ValueError(f"Program.files paths must be relative and stay inside the working dir, got {path!r}")
            if not isinstance(text, str):
                raise ValueError(f"Program.files[{path!r}] must be str, got {type(text).__name__}")
        if not isinstance(self.stdin, str):
            raise ValueError(f"Program.stdin must be str, got {type(self.stdin).__name__}")
        texts = [(f"argv[{i}]", a, True) for i, a in enumerate(self.argv)]
        texts += [(f"the file name {path!r}", str(path), True) for path in self.files]
        texts += [(f"the file {path!r}", text, False) for path, text in self.files.items()]
        for where, text, no_nul in [*texts, ("stdin", self.stdin, False)]:
            _check_text(where, text, no_nul)


class BadProgram(ValueError):
    """A ``Program`` that cannot be sent to a sandbox (invalid text, NUL in argv or a path)."""


def bad_text(value: Any) -> str | None:
    """Why ``value`` (a call argument: str, or lists/dicts of them) cannot be sent as UTF-8 text."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return (f"holds {value[e.start]!r} at character {e.start}, a lone surrogate that is not valid "
                    "Unicode text; send plain UTF-8 text")
        return None
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        problem = bad_text(key) if isinstance(key, str) else None
        problem = problem or bad_text(item)
        if problem is not None:
            return problem
    return None


def _check_text(where: str, text: str, no_nul: bool) -> None:
    """Raise a "bad arguments" ValueError if ``text`` cannot be sent as UTF-8 (or holds NUL)."""
    problem = bad_text(text)
    if problem is not None:
        raise BadProgram(f"{where} {problem}")
    if no_nul and "\0" in text:
        raise BadProgram(f"{where} holds a NUL character at character {text.index(chr(0))}, "
                         "which a command line or file name cannot carry; remove it")
