"""The test tiers stay honest: ``make test-fast`` (``pytest -m "not slow"``) must not quietly
grow a training run, a server, a vLLM engine or a subprocess.

Read statically (``ast``, no imports, well under a second): a test *runs* something when its
body, or a module-level function, fixture or class it names (through its arguments or calls,
followed transitively, conftest.py fixtures included), calls

- the trainer (``turnrl.train.loop.train``, the ``turnrl.train.entry`` / ``turnrl.bench.grid`` /
  ``turnrl.bench.suite`` entry points, a ``python -m turnrl.train`` or ``python -m turnrl train``
  command, the latter also through a helper of the test module that runs ``-m turnrl *args``) or starts a
  server (``spawn_policy_server``,
  ``start_server``, ``serve-env`` / ``serve-policy`` / ``turnrl.tools.serve`` / a vLLM server
  command): then it must be marked ``e2e`` and ``slow``;
- a vLLM engine, a docker engine (``connect``), or a new interpreter of this Python
  (``sys.executable``: it imports torch, seconds at least): then it must be marked ``slow``.

Every ``e2e`` test must also be ``slow``, so the fast tier holds no end-to-end test.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# qualified names (module.attr as imported) whose call means an end-to-end run
E2E_CALLS = {"turnrl.train.loop.train", "turnrl.train.entry.main", "turnrl.bench.grid.main",
             "turnrl.bench.suite.run_suite", "turnrl.bench.grid.train_cell", "turnrl.bench.suite.train_cell",
             "turnrl.policies.server.spawn_policy_server", "tests.helpers.start_server"}
# argv strings of an end-to-end run (trainer CLI, servers)
E2E_STRINGS = {"turnrl.train", "turnrl-train", "serve-env", "serve-policy", "turnrl.tools.serve",
               "vllm.entrypoints.openai.api_server"}
# the ``turnrl`` command line's subcommand that trains: ``[..., "turnrl", "train", ...]``
E2E_SUBCOMMAND = ("turnrl", "train")
# names whose use means a slow test: a vLLM engine, a docker engine, a new interpreter of this
# Python (it imports turnrl and torch: seconds before it does anything)
SLOW_NAMES = {"turnrl.policies.vllm_engine.VLLMPolicy", "tests.helpers.warm_vllm_model",
              "turnrl.tools.executors.docker.executor.connect", "sys.executable"}
# files that name the trainer or the servers without running them
READ_ONLY = {"test_docs.py": "parses the documented command lines against the real parsers",
             "train/test_trainer_shape.py": "reads train()'s source and the package's syntax trees"}


def _imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> qualified name for the module's top-level imports."""
    names = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                names[(a.asname or a.name).split(".")[0]] = (a.name if a.asname else a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _qualified(node: ast.AST, imports: dict[str, str]) -> str | None:
    """``a.b.c`` with ``a`` replaced by what it was imported as, or None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in imports:
        return None
    return ".".join([imports[node.id], *reversed(parts)])


def _strings(nodes: list[ast.expr]) -> list[str | None]:
    return [n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) else None for n in nodes]


def _runs_the_trainer_subcommand(strings: list[str | None]) -> bool:
    """``"turnrl", "train"`` one after the other (``-m turnrl train``, the ``turnrl train`` script)."""
    return any(tuple(strings[i:i + 2]) == E2E_SUBCOMMAND for i in range(len(strings) - 1))


def _cli_helpers(definitions: dict[str, ast.AST]) -> set[str]:
    """Functions that run ``-m turnrl`` with their arguments after it (``[..., "-m", "turnrl", *args]``):
    a call of one with ``"train"`` first runs the trainer."""
    helpers = set()
    for name, node in definitions.items():
        for sub in ast.walk(node):
            if isinstance(sub, (ast.List, ast.Tuple)):
                strings = _strings(sub.elts)
                if any(strings[i:i + 2] == ["-m", "turnrl"] and isinstance(sub.elts[i + 2], ast.Starred)
                       for i in range(len(strings) - 2)):
                    helpers.add(name)
    return helpers


def _scan(node: ast.AST, imports: dict[str, str], cli_helpers: set[str] = frozenset()) -> tuple[set[str], set[str]]:
    """The marks the code under ``node`` itself requires, and the names it uses (the names in its
    body and, for a function, its argument names: the fixtures of a test or fixture)."""
    needs, names = set(), set()
    for sub in ast.walk(node):
        if isinstance(sub, (ast.List, ast.Tuple)) and _runs_the_trainer_subcommand(_strings(sub.elts)):
            needs |= {"e2e", "slow"}
        elif isinstance(sub, ast.Call) and (
                _runs_the_trainer_subcommand(_strings(sub.args))
                or (isinstance(sub.func, ast.Name) and sub.func.id in cli_helpers
                    and _strings(sub.args[:1]) == ["train"])):
            needs |= {"e2e", "slow"}
        if isinstance(sub, ast.Constant):
            if isinstance(sub.value, str) and sub.value in E2E_STRINGS:
                needs |= {"e2e", "slow"}
        elif isinstance(sub, (ast.Name, ast.Attribute)):
            if isinstance(sub, ast.Name):
                names.add(sub.id)
            name = _qualified(sub, imports)
            if name in E2E_CALLS:
                needs |= {"e2e", "slow"}
            elif name in SLOW_NAMES:
                needs.add("slow")
        elif isinstance(sub, ast.arg):
            names.add(sub.arg)
    return needs, names


def _marks(decorators: list[ast.expr]) -> set[str]:
    """``slow`` / ``e2e`` of ``pytest.mark.<name>`` in decorators (or a ``pytestmark`` value)."""
    return {sub.attr for d in decorators for sub in ast.walk(d)
            if isinstance(sub, ast.Attribute) and sub.attr in ("slow", "e2e")
            and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark"}


def _definitions(tree: ast.Module) -> dict[str, ast.AST]:
    return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def tier_problems(source: str, conftests: list[str] = (), where: str = "<test module>") -> list[str]:
    """What is wrong with the marks of the tests in ``source`` (a test module's text), given the
    text of the conftest.py files above it (their fixtures are followed too)."""
    tree = ast.parse(source)
    imports = _imports(tree)
    # name -> (definition, imports of its module); the module's own definitions shadow conftest's
    defs = {}
    for text in conftests:
        ctree = ast.parse(text)
        cimports = _imports(ctree)
        defs.update({name: (node, cimports) for name, node in _definitions(ctree).items()})
    defs.update({name: (node, imports) for name, node in _definitions(tree).items()})
    cli_helpers = _cli_helpers({name: node for name, (node, _) in defs.items()})

    own: dict[int, tuple[set[str], set[str]]] = {}  # id(definition) -> (its own needs, names it uses)

    def required(node: ast.AST, imps: dict[str, str], seen: set[str]) -> set[str]:
        if id(node) not in own:
            own[id(node)] = _scan(node, imps, cli_helpers)
        needs, refs = own[id(node)]
        needs = set(needs)
        for ref in refs - seen:
            if ref in defs:
                seen.add(ref)
                needs |= required(*defs[ref], seen)
        return needs

    module_marks = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            module_marks |= _marks([node.value])
    problems = []
    for name, (node, _) in defs.items():
        if not name.startswith(("test", "Test")) or node not in tree.body:
            continue
        if isinstance(node, ast.ClassDef):
            tests = [(f"{name}.{m.name}", m, _marks(node.decorator_list)) for m in node.body
                     if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test")]
        else:
            tests = [(name, node, set())]
        for label, fn, class_marks in tests:
            marks = module_marks | class_marks | _marks(fn.decorator_list)
            needs = required(fn, imports, {name})
            missing = needs - marks
            if missing:
                problems.append(f"{where}::{label} runs a {'trainer or server' if 'e2e' in missing else 'subprocess or engine'}"
                                f" but is not marked {' and '.join(sorted(missing))}")
            if "e2e" in marks and "slow" not in marks:
                problems.append(f"{where}::{label} is marked e2e but not slow")
    return problems


def conftests_above(path: Path) -> list[str]:
    return [(d / "conftest.py").read_text() for d in [*reversed(path.parents)]
            if d.is_relative_to(TESTS) and (d / "conftest.py").is_file()]


def test_every_training_server_engine_or_subprocess_test_is_in_the_slow_tier():
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 50  # the suite, not an empty glob
    problems = [p for f in files if f.relative_to(TESTS).as_posix() not in READ_ONLY
                for p in tier_problems(f.read_text(), conftests_above(f), str(f.relative_to(TESTS)))]
    assert not problems, "mark these (see tests/test_tiers.py):\n" + "\n".join(problems)


UNMARKED = '''
import subprocess, sys
import pytest
from turnrl.train.loop import train as run_training
from tests.helpers import start_server

def _config():
    return {}

def _fit(tmp):
    return run_training(_config(), tmp)

@pytest.fixture
def server():
    yield start_server(["x"], "http://127.0.0.1:1", None)

def test_pure():
    assert 1 + 1 == 2

def test_trains_through_a_helper(tmp_path):
    assert _fit(tmp_path)

def test_uses_a_server_fixture(server):
    assert server

def test_cli():
    subprocess.run([sys.executable, "-m", "turnrl.train"])

@pytest.mark.e2e
def test_e2e_only():
    pass

class TestGroup:
    def test_spawns(self):
        subprocess.run([sys.executable, "-c", "pass"])

    def test_runs_a_light_process(self):
        subprocess.run(["true"])
'''


def test_the_check_finds_unmarked_runs_through_helpers_fixtures_and_argv():
    problems = tier_problems(UNMARKED)
    assert [p.split("::")[1].split(" ")[0] for p in problems] == [
        "test_trains_through_a_helper", "test_uses_a_server_fixture", "test_cli", "test_e2e_only",
        "TestGroup.test_spawns"]
    assert "not marked e2e and slow" in problems[0] and "not marked e2e and slow" in problems[2]
    assert "not marked e2e and slow" in problems[1]
    assert problems[3].endswith("is marked e2e but not slow")
    assert problems[4].endswith("not marked slow")


def test_the_check_accepts_module_function_and_class_marks():
    marked = (UNMARKED.replace("def test_trains_through_a_helper", "@pytest.mark.slow\n@pytest.mark.e2e\ndef test_trains_through_a_helper")
              .replace("def test_uses_a_server_fixture", "@pytest.mark.e2e\n@pytest.mark.slow\ndef test_uses_a_server_fixture")
              .replace("@pytest.mark.e2e\ndef test_e2e_only", "@pytest.mark.e2e\n@pytest.mark.slow\ndef test_e2e_only")
              .replace("class TestGroup", "@pytest.mark.slow\nclass TestGroup"))
    assert tier_problems(marked) == ["<test module>::test_cli runs a trainer or server but is not marked e2e and slow"]
    whole_module = marked + "\npytestmark = [pytest.mark.slow, pytest.mark.e2e]\n"
    assert tier_problems(whole_module) == []


TRAIN_SUBCOMMAND = '''
import subprocess, sys
import pytest

def turnrl(*args):
    return subprocess.run([sys.executable, "-m", "turnrl", *args])

def test_lists_envs():
    turnrl("list-envs")

def test_trains_through_the_helper():
    turnrl("train", "trainer.steps=1")

def test_trains_by_argv():
    subprocess.run(["turnrl", "train", "seed=1"])

def test_names_the_split():
    assert "train" in ["train", "test"]
'''


def test_the_check_finds_the_turnrl_train_subcommand():
    problems = tier_problems(TRAIN_SUBCOMMAND)
    assert [p.split("::")[1].split(" ")[0] for p in problems] == [
        "test_lists_envs", "test_trains_through_the_helper", "test_trains_by_argv"]
    assert problems[0].endswith("not marked slow")
    assert all(p.endswith("not marked e2e and slow") for p in problems[1:])
