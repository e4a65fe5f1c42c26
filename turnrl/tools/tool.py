"""The ``Tool`` value and the ``tool`` decorator that derives its JSON schema (for functions and
for methods of a class, ``ToolMethod``)."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
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

    On a method in a class body (a function whose first parameter is ``self``) it returns a
    ``ToolMethod``: ``instance.method`` is then the ``Tool`` bound to that instance, so the
    tool can read the instance's state (an env's current task). A ``MultiTurnEnv`` offers
    its ``@tool`` methods to the model with its other tools.

    Args:
        fn: A plain function, bound method or method with a type hint on every parameter
            but ``self`` (None when used as ``@tool(executor=...)``: a decorator is returned).
        executor: The tool's default executor kind (``Tool.executor``).

    Returns:
        The ``Tool`` named ``fn.__name__`` (a ``ToolMethod`` for a method in a class body).

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
    if inspect.isfunction(fn) and next(iter(inspect.signature(fn).parameters), None) == "self":
        return ToolMethod(tool(fn.__get__(_Unbound()), executor=executor))
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


class _Unbound:
    """Stands for the instance while a method's schema is derived (the method is not called)."""


@dataclass(frozen=True)
class ToolMethod:
    """A ``@tool`` method in a class body: a descriptor whose value on an instance is the ``Tool``
    bound to it (``env.lookup`` is a ``Tool`` calling ``lookup(env, ...)``); on the class it is
    this object. The schema is derived, and checked, when the class is defined.

    Attributes:
        template: The tool, with ``fn`` bound to a placeholder instance (never called).
    """

    template: Tool

    @property
    def name(self) -> str:
        """The tool's name (the method's)."""
        return self.template.name

    def bind(self, instance: Any) -> Tool:
        """The tool calling the method on ``instance``."""
        return replace(self.template, fn=self.template.fn.__func__.__get__(instance))

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self if instance is None else self.bind(instance)


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


def bind_tools(tools: Iterable[Tool | ToolMethod], instance: Any) -> tuple[Tool, ...]:
    """``tools`` as ``Tool`` objects, each ``ToolMethod`` bound to ``instance``, followed by the
    ``@tool`` methods of ``instance``'s class not listed (in definition order, base classes first;
    a method a subclass redefines without ``@tool`` is not a tool).

    Raises:
        TypeError: If an item is neither a ``Tool`` nor a ``ToolMethod`` (the message says how
            to make one).
    """
    if isinstance(tools, (Tool, ToolMethod, str)) or not isinstance(tools, Iterable):
        raise TypeError(f"tools must be a tuple of tools, got {tools!r}; write tools = (my_tool,)")
    bound: list[Tool] = []
    for item in tools:
        if isinstance(item, ToolMethod):
            item = item.bind(instance)
        if not isinstance(item, Tool):
            raise TypeError(f"tools holds {item!r}, which is not a tool; decorate the function with @tool "
                            "(from turnrl.tools import tool)")
        bound.append(item)
    methods: dict[str, ToolMethod] = {}
    for klass in reversed(type(instance).__mro__):
        for attr, value in vars(klass).items():
            if isinstance(value, ToolMethod):
                methods[attr] = value
            else:
                methods.pop(attr, None)
    listed = {t.name for t in bound}
    return (*bound, *(m.bind(instance) for m in methods.values() if m.name not in listed))


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
