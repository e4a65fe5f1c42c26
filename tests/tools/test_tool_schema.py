from typing import Literal, Optional

import pytest

from turnrl.tools import Tool, tool


def search(query: str, limit: int, scale: float = 1.0, exact: bool = False,
           tags: list[str] | None = None, mode: Literal["fast", "slow"] = "fast") -> str:
    """Search the index.

    Longer explanation that is not part of the description.

    Args:
        query: Text to look for.
        limit (int): Maximum number of hits,
            counted after de-duplication.
        scale: Score multiplier.
        exact: Match the whole phrase only.
        tags: Only hits with these tags.
        mode: Search speed.

    Returns:
        The hits, one per line.
    """
    return f"{query}:{limit}:{scale}:{exact}:{tags}:{mode}"


def test_schema_types_required_enum_and_descriptions():
    t = tool(search)
    assert isinstance(t, Tool) and t.name == "search"
    assert t.description == "Search the index."
    params = t.parameters
    assert params["type"] == "object"
    assert params["required"] == ["query", "limit"]
    props = params["properties"]
    assert props["query"] == {"type": "string", "description": "Text to look for."}
    assert props["limit"] == {
        "type": "integer",
        "description": "Maximum number of hits, counted after de-duplication.",
    }
    assert props["scale"]["type"] == "number"
    assert props["exact"]["type"] == "boolean"
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "description": "Only hits with these tags."}
    assert props["mode"] == {"type": "string", "enum": ["fast", "slow"], "description": "Search speed."}


def test_openai_function_schema_and_call():
    t = tool(search)
    schema = t.schema()
    assert schema["type"] == "function"
    assert schema["function"] == {"name": "search", "description": "Search the index.", "parameters": t.parameters}
    assert t("a", 2) == "a:2:1.0:False:None:fast"


def test_optional_without_default_is_not_required():
    def f(x: Optional[int], y: list[int]) -> str:
        """F.

        Args:
            x: An x.
            y: Some ys.
        """
        return ""

    t = tool(f)
    assert t.parameters["required"] == ["y"]
    assert t.parameters["properties"]["x"]["type"] == "integer"
    assert t.parameters["properties"]["y"]["items"] == {"type": "integer"}


def test_bound_method_skips_self():
    class Counter:
        def add(self, amount: int) -> int:
            """Add to the counter.

            Args:
                amount: How much to add.
            """
            return amount + 1

    t = tool(Counter().add)
    assert t.name == "add"
    assert list(t.parameters["properties"]) == ["amount"]
    assert t.fn(amount=2) == 3


def test_missing_type_hint_names_function_and_parameter():
    def f(x) -> str:
        """F.

        Args:
            x: An x.
        """
        return ""

    with pytest.raises(TypeError, match=r"'f'.*'x'.*type hint"):
        tool(f)


def test_undocumented_parameter_names_function_and_parameter():
    def g(x: int, y: int) -> str:
        """G.

        Args:
            x: An x.
        """
        return ""

    with pytest.raises(TypeError, match=r"'g'.*'y'.*not documented"):
        tool(g)


def test_missing_docstring_and_bad_hints_raise():
    def h(x: int) -> str:
        return ""

    with pytest.raises(TypeError, match="docstring"):
        tool(h)

    def k(x: set) -> str:
        """K.

        Args:
            x: An x.
        """
        return ""

    with pytest.raises(TypeError, match=r"'k'.*'x'.*unsupported"):
        tool(k)

    def m(*xs: int) -> str:
        """M.

        Args:
            xs: Xs.
        """
        return ""

    with pytest.raises(TypeError, match=r"'m'.*'xs'"):
        tool(m)


def test_documented_name_that_is_not_a_parameter_raises():
    def n(x: int) -> str:
        """N.

        Args:
            x: An x.
            z: Typo.
        """
        return ""

    with pytest.raises(TypeError, match=r"'n'.*\['z'\]"):
        tool(n)
