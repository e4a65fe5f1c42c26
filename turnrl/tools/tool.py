"""The ``Tool`` value and the ``tool`` decorator that derives its JSON schema."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from turnrl.tools.docstring import parse_docstring
from turnrl.tools.schema import hint_to_schema, unwrap_optional


@dataclass(frozen=True)
class Tool:
    """A function the model may call, with its JSON-schema description.

    Attributes:
        name: Name the model uses in a tool call.
        description: One-paragraph description shown to the model.
        parameters: JSON schema of the arguments: ``{"type": "object",
            "properties": {...}, "required": [...]}``.
        fn: The callable; it is called as ``fn(**arguments)``. A *code tool*'s ``fn``
            returns a ``turnrl.tools.executors.Program`` that its executor runs.
        executor: The kind of executor that runs the tool by default (a name in
            ``turnrl.tools.executors.EXECUTORS``: ``"inprocess"``, ``"sandbox"``, ...);
            an env may override it per tool.
    """

    name: str
    description: str
    parameters: dict = field(hash=False)
    fn: Callable[..., Any] = field(hash=False, compare=False)
    executor: str = "inprocess"

    def schema(self) -> dict:
        """The OpenAI / Qwen function schema ``{"type": "function", "function": {...}}``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (no validation)."""
        return self.fn(*args, **kwargs)


def tool(fn: Callable[..., Any] | None = None, *, executor: str = "inprocess") -> Any:
    """Build a ``Tool`` from a typed, Google-style documented function.

    The description is the docstring's first paragraph; each parameter's
    description comes from the ``Args:`` section. Parameters with a default or
    an ``Optional[X]`` hint are not required. Bound methods work (``self`` is
    not part of the signature). Usable as a decorator: ``@tool``, or
    ``@tool(executor="sandbox")`` for a code tool; also ``tool(fn, executor=...)``.

    Args:
        fn: A plain function or bound method with a type hint on every parameter
            (None when used as ``@tool(executor=...)``: a decorator is returned).
        executor: The tool's default executor kind (``Tool.executor``).

    Returns:
        The ``Tool`` named ``fn.__name__``.

    Raises:
        TypeError: If a parameter lacks a type hint, has an unsupported hint, is
            not documented in ``Args:``, is ``*args``/``**kwargs``, or the
            function has no docstring summary. The message names the function
            and the parameter; also if ``executor`` is not a non-empty str.
    """
    if not isinstance(executor, str) or not executor:
        raise TypeError(f"tool(): executor must be an executor kind such as 'sandbox', got {executor!r}")
    if fn is None:
        return lambda f: tool(f, executor=executor)
    name = getattr(fn, "__name__", None)
    if not callable(fn) or not name:
        raise TypeError(f"tool() needs a named function or bound method, got {fn!r}")
    doc = parse_docstring(inspect.getdoc(fn))
    if not doc.summary:
        raise TypeError(f"tool {name!r}: add a docstring whose first paragraph describes the tool")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:  # unresolvable forward references
        raise TypeError(f"tool {name!r}: cannot resolve type hints ({e})") from e

    properties: dict[str, dict] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        schema, is_required = _parameter_schema(name, param, hints, doc.args)
        properties[param.name] = schema
        if is_required:
            required.append(param.name)
    unknown = sorted(set(doc.args) - set(properties))
    if unknown:
        raise TypeError(
            f"tool {name!r}: docstring Args documents {unknown} which are not parameters; "
            "fix the names or remove them"
        )
    parameters = {"type": "object", "properties": properties, "required": required}
    return Tool(name=name, description=doc.summary, parameters=parameters, fn=fn, executor=executor)


def _parameter_schema(
    fn_name: str, param: inspect.Parameter, hints: dict, docs: dict[str, str]
) -> tuple[dict, bool]:
    where = f"tool {fn_name!r}, parameter {param.name!r}"
    if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
        raise TypeError(f"{where}: *args/**kwargs cannot be described by a JSON schema; name each argument")
    if param.kind is inspect.Parameter.POSITIONAL_ONLY:
        raise TypeError(f"{where}: positional-only parameters cannot be passed by name; remove the '/'")
    if param.name not in hints:
        raise TypeError(f"{where}: missing type hint; annotate it, e.g. '{param.name}: str'")
    if not docs.get(param.name):
        raise TypeError(f"{where}: not documented; add '{param.name}: <description>' under 'Args:'")
    hint, optional = unwrap_optional(hints[param.name])
    try:
        schema = hint_to_schema(hint)
    except TypeError as e:
        raise TypeError(f"{where}: {e}") from e
    schema["description"] = docs[param.name]
    has_default = param.default is not inspect.Parameter.empty
    return schema, not (optional or has_default)


def tool_map(tools: Iterable[Tool]) -> dict[str, Tool]:
    """Index tools by name.

    Args:
        tools: Tools with distinct names.

    Returns:
        A new dict ``name -> Tool``.

    Raises:
        ValueError: If two tools share a name.
    """
    by_name: dict[str, Tool] = {}
    for t in tools:
        if t.name in by_name:
            raise ValueError(f"two tools are named {t.name!r}; tool names must be unique")
        by_name[t.name] = t
    return by_name
