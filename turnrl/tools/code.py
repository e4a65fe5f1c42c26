"""Built-in code tools: their fn returns a ``Program`` that a sandboxing executor runs."""

from __future__ import annotations

from turnrl.tools.executors.base import Program
from turnrl.tools.tool import tool

__all__ = ["run_python", "run_shell"]


@tool(executor="sandbox")
def run_python(code: str) -> Program:
    """Run a Python 3 program in a sandbox and return its exit code, stdout and stderr.

    Args:
        code: The complete program; it is saved as main.py in a private working dir that
            keeps its files between calls of the same episode. Print what you want to see.
    """
    return Program(("python3", "main.py"), {"main.py": code})


@tool(executor="sandbox")
def run_shell(command: str) -> Program:
    """Run a bash command in a sandbox (no network) and return its exit code, stdout and stderr.

    Args:
        command: The bash command line, run in a private working dir that keeps its files
            between calls of the same episode.
    """
    return Program(("bash", "-c", command))
