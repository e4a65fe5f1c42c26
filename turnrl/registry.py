"""A name -> function registry: how every swappable piece (advantage estimators, loss
aggregations, KL estimators, tool-call parsers and formatters) is looked up by config.
Unknown names list the valid ones."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Maps names to functions. ``registry.register("name")`` is a decorator.

    Supports ``name in registry``, iteration over names, ``len`` and ``registry[name]``;
    ``registry[name]`` and ``registry.get(name)`` raise ``KeyError`` listing the valid names.
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._fns: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator registering ``fn`` under ``name``; a taken name raises ``ValueError``."""

        def deco(fn: F) -> F:
            if name in self._fns:
                raise ValueError(f"{self.kind} {name!r} is already registered; choose another name")
            self._fns[name] = fn
            return fn

        return deco

    def get(self, name: str) -> F:
        """The function registered under ``name``."""
        try:
            return self._fns[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; valid names: {sorted(self._fns)}") from None

    __getitem__ = get

    def names(self) -> list[str]:
        return sorted(self._fns)

    def __contains__(self, name: object) -> bool:
        return name in self._fns

    def __iter__(self) -> Iterator[str]:
        return iter(self._fns)

    def __len__(self) -> int:
        return len(self._fns)
