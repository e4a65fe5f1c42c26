"""The train loop's shape, which every later feature depends on: ``train`` stays one screen,
and only the factories that build a run's sampler and pipeline ask which ones it has."""

import ast
import inspect
from pathlib import Path

import turnrl
from turnrl.train.loop import train

PACKAGE = Path(turnrl.__file__).parent
# the only functions that may branch on the backend or the pipeline kind
FACTORIES = {("train/factories.py", "rollout_policy"), ("train/rollout_source.py", "rollout_source"),
             ("conf/validate.py", "problems")}
KIND_SETTINGS = {"backend", "async_rollouts"}


def test_train_reads_in_one_screen():
    lines = [line for line in inspect.getsource(train).splitlines() if line.strip()]
    assert len(lines) <= 60, f"train() has {len(lines)} non-blank lines; move work into its stages"


def _branches_on_kind(tree):
    """(function, line) of every if/ternary/comparison that reads ``.backend`` or ``.async_rollouts``."""
    found = []

    def visit(node, func):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func = node.name
        tests = []
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            tests.append(node.test)
        if isinstance(node, ast.Compare):
            tests.append(node)
        for test in tests:
            if any(isinstance(n, ast.Attribute) and n.attr in KIND_SETTINGS for n in ast.walk(test)):
                found.append((func, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, func)

    visit(tree, None)
    return sorted(set(found))


def test_only_the_factories_ask_which_sampler_or_pipeline_a_run_has():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for func, line in _branches_on_kind(ast.parse(path.read_text())):
            if (rel, func) not in FACTORIES:
                offenders.append(f"{rel}:{line} ({func})")
    assert not offenders, f"branches on agent.backend / trainer.async_rollouts outside the factories: {offenders}"


def test_the_check_finds_a_branch_on_the_backend():
    tree = ast.parse("def step(cfg):\n    if cfg.agent.backend == 'http':\n        pass\n")
    assert _branches_on_kind(tree) == [("step", 2)]
