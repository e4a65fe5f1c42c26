"""README.md and docs/*.md say only what is true of the code, without running anything slow.

Every relative link (and its #anchor) resolves; every ```python block compiles; every command
in a ```bash block parses: ``python -m turnrl SUB ...`` with the real argparse parser (for
``bench --suite``, the suite is loaded and its cells' overrides composed),
``python -m turnrl.train ...`` (also under ``accelerate launch``) composed by Hydra against
the schema, ``python -m turnrl.bench.grid ...`` with its own parser, ``make TARGET`` against the
Makefile; and every config key, repository path and ``turnrl.`` name written in inline code
exists. The README's own-env example is run by ``tests/test_readme_example.py`` and the
docs' gymnasium snippet by ``tests/envs/test_env_registration.py``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
import shlex
import typing
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser

from turnrl.conf.schema import Config, register_configs

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
CONF = ROOT / "turnrl" / "conf"
GROUPS = ("env", "agent", "algorithm", "trainer", "experiment")
# make targets the README documents that another change adds to the Makefile; checked once present
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
SPAN = re.compile(r"`([^`\n]+)`")
ROOT_KEYS = "env|agent|algorithm|trainer|dpo|reward_model|seed|experiment"
OVERRIDE_KEY = re.compile(rf"^\+?({ROOT_KEYS})(?!\w)((?:\.(?:\w+|\*))*)(.?)")

register_configs()


def rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def blocks(page: Path, lang: str) -> list[str]:
    return [body for tag, body in FENCE.findall(page.read_text()) if tag == lang]


def prose(page: Path) -> str:
    """The page without its fenced blocks."""
    return FENCE.sub("", page.read_text())


def spans(page: Path) -> list[str]:
    return SPAN.findall(prose(page))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", prose(page), re.M)}


def commands(page: Path) -> list[list[str]]:
    """Each command line of the page's bash blocks, split as the shell does (comments dropped)."""
    lines = [line for body in blocks(page, "bash") for line in body.splitlines()]
    return [shlex.split(line, comments=True) for line in lines if line.strip() and not line.startswith("export ")]


def all_commands() -> list[tuple[str, list[str]]]:
    return [(rel(page), argv) for page in PAGES for argv in commands(page) if argv]


def command_id(item) -> str:
    page, argv = item
    return f"{page}: {' '.join(argv)[:70]}"


# ------------------------------------------------------------------------- the first page
def test_the_readme_starts_with_the_two_commands_and_stays_a_first_page():
    text = README.read_text()
    assert text.startswith("# turnrl\n\n```bash\nmake train ")
    first = blocks(README, "bash")[0]
    assert [line.split()[:2] for line in first.splitlines()] == [["make", "train"], ["make", "test"]]
    assert len(text.splitlines()) <= 225, "the README is a first page: move detail into docs/"
    assert "## Write your own environment" in text[:text.index("## Configs")]  # the example is near the top


def test_the_readme_and_the_docs_index_link_every_docs_page():
    pages = {page.name for page in DOCS.glob("*.md")} - {"README.md"}
    readme_links = {Path(target.split("#")[0]).name for target in LINK.findall(prose(README))
                    if target.startswith("docs/")}
    index_links = {target.split("#")[0] for target in LINK.findall(prose(DOCS / "README.md"))}
    assert pages <= readme_links and "README.md" in readme_links
    assert pages <= index_links


# ------------------------------------------------------------------------- links, code, paths
@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_and_anchors_resolve(page):
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{rel(page)}: link to {target!r}: no such file"
        if anchor:
            assert dest.suffix == ".md" and anchor in anchors(dest), \
                f"{rel(page)}: link to {target!r}: no heading with that anchor in {rel(dest)}"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_python_blocks_compile(page):
    for code in blocks(page, "python"):
        compile(code, f"{rel(page)} python block", "exec")


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_repository_paths_in_inline_code_exist(page):
    for span in spans(page):
        if re.fullmatch(r"(turnrl|tests|scripts|docs)/[\w./-]*", span):
            assert (ROOT / span).exists(), f"{rel(page)}: `{span}` does not exist"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_turnrl_names_in_inline_code_resolve(page):
    for span in spans(page):
        match = re.fullmatch(r"(turnrl(?:\.\w+)+)(\(.*\))?", span)
        if match:
            resolve(match.group(1))


def resolve(dotted: str):
    first, *rest = dotted.split(".")
    obj, name = importlib.import_module(first), first
    for attr in rest:
        name = f"{name}.{attr}"
        if not hasattr(obj, attr) and importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
        assert hasattr(obj, attr), f"`{dotted}`: {obj.__name__} has no {attr!r}"
        obj = getattr(obj, attr)
    return obj


# ------------------------------------------------------------------------- config keys
def schema_has(path: list[str]) -> bool:
    """Whether ``a.b.c`` is a field of the schema; below a dict-typed field any key is."""
    cls: typing.Any = Config
    for name in path:
        if name == "*":
            return True
        if not dataclasses.is_dataclass(cls):
            return typing.get_origin(cls) is dict or cls is typing.Any
        hints = typing.get_type_hints(cls)
        if name not in hints:
            return False
        cls = hints[name]
    return True


def check_override_token(token: str, where: str) -> None:
    match = OVERRIDE_KEY.match(token)
    if not match:
        return
    root, rest, after = match.group(1), match.group(2), match.group(3)
    keys = [root, *rest.split(".")[1:]]
    if after == "(":  # a method call on a variable named like a group (env.tools_prompt())
        return
    if rest:
        assert schema_has(keys), f"{where}: `{token}`: {'.'.join(keys)} is no key of the schema"
    elif after == "=":
        value = token.split("=", 1)[1]
        if root in GROUPS:
            for option in value.split(","):
                if option and not option.startswith("<"):
                    assert (CONF / root / f"{option}.yaml").exists(), \
                        f"{where}: `{token}`: no config turnrl/conf/{root}/{option}.yaml"
        else:
            assert schema_has(keys), f"{where}: `{token}`: {root} is no key of the schema"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_config_keys_and_group_options_in_inline_code_exist(page):
    for span in spans(page):
        for token in span.split():
            check_override_token(token, rel(page))


def test_the_key_check_catches_a_wrong_key():
    with pytest.raises(AssertionError, match="trainer.stepz"):
        check_override_token("trainer.stepz=3", "here")
    with pytest.raises(AssertionError, match="no_such_env"):
        check_override_token("env=no_such_env", "here")
    check_override_token("env.kwargs.anything=1", "here")  # kwargs is a dict


# ------------------------------------------------------------------------- commands
def compose_overrides(overrides: list[str]) -> None:
    """Compose every value of every sweep (``-m a=x,y``) against the schema; hydra.* is Hydra's own."""
    overrides = [o for o in overrides if not o.startswith("hydra.")]
    parsed = OverridesParser.create().parse_overrides(overrides)
    base = [o.input_line if not o.is_sweep_override() else f"{o.get_key_element()}={next(o.sweep_string_iterator())}"
            for o in parsed]
    runs = [base]
    for i, o in enumerate(parsed):
        if o.is_sweep_override():
            runs += [[*base[:i], f"{o.get_key_element()}={value}", *base[i + 1:]]
                     for value in o.sweep_string_iterator()]
    runs = list(dict.fromkeys(map(tuple, runs)))  # each distinct composition once
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        for run in runs:
            compose(config_name="config", overrides=list(run))


def check_command(argv: list[str]) -> None:
    while argv and re.fullmatch(r"\w+=.*", argv[0]):  # VAR=value prefixes
        argv = argv[1:]
    if argv[0] == "sudo":
        argv = argv[1:]
    if argv[0] == "make":
        targets = set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.M))
        for target in (a for a in argv[1:] if "=" not in a):
            assert target in targets, f"make {target}: no such Makefile target"
        return
    if argv[0] == "accelerate":
        assert argv[1] == "launch" and "-m" in argv
        config = argv[argv.index("--config_file") + 1]
        assert (ROOT / config).exists(), config
        argv = ["python", *argv[argv.index("-m"):]]
    if argv[0].endswith("python") and argv[1].startswith("scripts/"):  # a benchmark script (tested on its own)
        assert (ROOT / argv[1]).is_file(), f"no script {argv[1]}"
        return
    assert argv[0] == "python" and argv[1] == "-m", argv
    module, args = argv[2], argv[3:]
    if module == "turnrl" and args[:1] == ["grid"]:
        check_bench(args[1:])
    elif module == "turnrl" and args[:1] == ["train"]:
        compose_overrides([a for a in args[1:] if a != "-m"])
    elif module == "turnrl":
        from turnrl.cli import _parser

        parsed = _parser().parse_args(args)  # exits (fails the test) on an unknown subcommand or option
        if parsed.command == "bench":
            check_suite(parsed)
    elif module == "turnrl.train":
        if any(a.startswith("hydra.searchpath") for a in args):
            return  # composed with the user's config folder: run for real by test_readme_example.py
        compose_overrides([a for a in args if a != "-m"])
    else:
        assert importlib.util.find_spec(module) is not None, f"no module {module}"


def check_bench(args: list[str]) -> None:
    import turnrl.bench.grid as bench

    seen = {}

    def run_grid(algorithms, seeds, overrides, out, variants=None):
        seen.update(algorithms=algorithms, overrides=overrides, variants=variants or {})
        return []

    saved = bench.run_grid, bench.markdown_table
    bench.run_grid, bench.markdown_table = run_grid, lambda records: ""
    try:
        assert bench.main(args) == 0
    finally:
        bench.run_grid, bench.markdown_table = saved
    for algorithm in seen["algorithms"]:
        assert (CONF / "algorithm" / f"{algorithm}.yaml").exists(), algorithm
    for extra in [[], *seen["variants"].values()]:
        compose_overrides([*seen["overrides"], *extra])


def check_suite(args) -> None:
    """``turnrl bench --suite``: the suite and the selection exist, and each env's first cell
    composes with the command's overrides."""
    from turnrl.bench.suite import load_suite

    suite = load_suite(args.suite).select(args.envs, args.methods, args.seeds)
    for env in suite.envs:
        compose_overrides([*suite.shared, *env.overrides, *suite.methods[0].overrides, *args.overrides])


@pytest.mark.parametrize("item", all_commands(), ids=command_id)
def test_every_command_in_a_bash_block_parses(item):
    page, argv = item
    check_command(argv)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_commands_in_inline_code_name_real_subcommands(page):
    from turnrl.cli import _parser

    subcommands = set(_parser()._subparsers._group_actions[0].choices)
    for span in spans(page):
        match = re.search(r"(?:python -m turnrl|^turnrl) ([\w-]+)", span)
        if match:
            assert match.group(1) in subcommands, f"{rel(page)}: `{span}`: no subcommand {match.group(1)!r}"
        match = re.search(r"python -m (turnrl\.[\w.]+)", span)
        if match:
            assert importlib.util.find_spec(match.group(1)) is not None, f"{rel(page)}: `{span}`"
        if span.startswith("make "):
            check_command(shlex.split(span))


def test_the_command_check_catches_wrong_ones():
    with pytest.raises(AssertionError, match="no script"):
        check_command([".venv/bin/python", "scripts/no_such_bench.py"])
    with pytest.raises(BaseException):
        check_command(["python", "-m", "turnrl", "check-envs", "x"])
    with pytest.raises(Exception, match="stepz"):
        check_command(["python", "-m", "turnrl.train", "trainer.stepz=1"])
    with pytest.raises(Exception):
        check_command(["python", "-m", "turnrl.train", "-m", "algorithm=grpo,no_such_algorithm"])
    with pytest.raises(Exception, match="no method"):
        check_command(["python", "-m", "turnrl", "bench", "--suite", "credit", "--methods", "no_such_method"])
    with pytest.raises(Exception, match="stepz"):
        check_command(["python", "-m", "turnrl", "bench", "--suite", "credit", "--", "trainer.stepz=1"])
    with pytest.raises(AssertionError, match="no such Makefile target"):
        check_command(["make", "trian"])
