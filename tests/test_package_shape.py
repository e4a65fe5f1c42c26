"""The package's shape stays one a newcomer can read: few top-level names, every folder saying
what it holds, and imports of the package's own modules at module top.

The layers themselves (which package may import which, no cycles) are import-linter's
contracts in pyproject.toml, run by ``make lint``; these tests cover what it does not.
Read statically (``ast``, no imports).
"""

from __future__ import annotations

import ast
from pathlib import Path

import turnrl

PACKAGE = Path(turnrl.__file__).resolve().parent

# What sits at the top of turnrl/: the subpackages a reader meets first, and the few modules
# everything shares. A new top-level name belongs in one of the packages; add it here only
# with a reason as good as these.
TOP_LEVEL = {
    "__init__.py", "__main__.py",
    "cli",          # the one command line: python -m turnrl train|eval|bench|grid|serve-*|...
    "conf",         # Hydra configs and their schema
    "train", "eval", "bench",
    "runs",         # what a run keeps for people to look at (rollouts), read by the trainer and the viewer
    "envs", "tools", "rollout", "algorithms", "policies", "chat", "models", "serving",
    "registry.py",  # the registries every package fills (estimators, losses, parsers, ...)
    "env_ids.py",   # the built-in env ids: `import turnrl` registers them without importing an env
    "rng.py",       # the global RNG states, saved by checkpoints and kept across engine start-up
}


def _top_level_names() -> set[str]:
    return {p.name for p in PACKAGE.iterdir()
            if p.name != "__pycache__" and (p.suffix == ".py" or (p / "__init__.py").is_file())}


def test_the_top_level_holds_only_the_listed_names():
    names = _top_level_names()
    assert names == TOP_LEVEL, (f"new at the top of turnrl/: {sorted(names - TOP_LEVEL)}; gone: "
                                f"{sorted(TOP_LEVEL - names)}. Put new modules in the package they belong to.")


def test_every_package_says_what_it_holds():
    for init in sorted(PACKAGE.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.split()) >= 8, f"{init.relative_to(PACKAGE.parent)} needs a docstring saying what it holds"


def _function_imports(tree: ast.Module):
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    yield node, node.module
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        yield node, alias.name


def test_no_module_imports_the_package_inside_a_function():
    """An import inside a function hides a layer from import-linter; the package defers only
    optional heavy dependencies (vllm, the docker SDK, matplotlib) that way, and the CLI loads a
    chosen subcommand's module through its ``COMMANDS`` table."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node, module in _function_imports(ast.parse(path.read_text())):
            if module.split(".")[0] == "turnrl":
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports {module}")
    assert not found, "import these at module top (import-linter then sees the layer):\n" + "\n".join(found)


def test_the_shape_check_finds_an_import_inside_a_function():
    tree = ast.parse("def f():\n    from turnrl.train.loop import train\n    import vllm\n")
    assert [m for _, m in _function_imports(tree)] == ["turnrl.train.loop", "vllm"]
