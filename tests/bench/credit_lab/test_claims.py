"""The lab's claims are written from its record: each sentence's numbers and words follow from
the rows it reads and name the cell, and the pages show exactly what the committed record gives."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from turnrl.bench.credit_lab.claims import (DOC_CLAIMS, Crossover, Flagged, Growth, Ratio, Summary,
                                            claims_markdown)

ROOT = Path(__file__).resolve().parents[3]


def row(x, method, nmse, bias2=0.0, variance=None, scale=1.0, angle=2.0, p_direction=0.5, p_scale=0.5,
        sweep="horizon", mdp=None, **extra):
    return {"sweep": sweep, "x": x, "method": method, "mdp": mdp or f"{x} mdp", "group_size": 8, "batches": 1000,
            "loss_agg": "seq-mean-token-sum", "staleness": 0.0, "infra_rate": 0.0, "infra_model": "step",
            "infra_policy": "drop", "nmse": nmse, "bias2": bias2,
            "variance": nmse - bias2 if variance is None else variance, "scale": scale, "angle": angle,
            "cosine": float(__import__("math").cos(__import__("math").radians(angle))), "p_direction": p_direction,
            "p_scale": p_scale, **extra}


@pytest.fixture
def rows():
    return [
        row("key_door H=32", "grpo", 13.2, scale=2.0, p_scale=1e-9, mdp="key_door L=10 H=32"),
        row("key_door H=32", "gigpo", 4.4, bias2=0.7, angle=40.0, p_direction=2e-4, scale=6.4, mdp="key_door L=10 H=32"),
        row("key_door H=32", "rloo", 13.3, mdp="key_door L=10 H=32"),
        row("key_door H=2", "grpo", 0.16),
        row("corridor H=32", "grpo", 7.0),
        row("corridor H=32", "gigpo", 6.5, bias2=0.1, angle=18.0, p_direction=4e-4),
        row("corridor H=32", "rloo", 7.1, scale=0.9),
        row("stop=0.1", "rloo", 1.3, sweep="ragged", p_direction=5e-4),
        row("stale=1", "rloo", 1.2, sweep="staleness", staleness=1.0, p_direction=2e-4),
    ]


def test_a_ratio_names_its_cell_and_the_bias_of_a_flagged_method(rows):
    text = Ratio("horizon", "key_door H=32", "gigpo", "grpo").text(rows)
    assert text.startswith("`gigpo`'s error is 0.33x `grpo`'s (nmse 4.4 against 13.2)")
    assert "`gigpo`'s mean gradient is 40 degrees off the true one (cosine 0.77; direction test p = 0.0002)" in text
    assert text.endswith("[horizon sweep, `key_door H=32`: key_door L=10 H=32, G=8, 1000 batches].")
    clean = Ratio("horizon", "corridor H=32", "rloo", "grpo").text(rows)
    assert "1.01x `grpo`'s" in clean and "no bias in `rloo`'s direction is detected (p = 0.5)" in clean


def test_a_crossover_is_where_bias_meets_variance_over_k(rows):
    # gigpo 0.7 + 3.7 / k against grpo 0 + 13.2 / k: equal at k = 9.5 / 0.7 = 13.6
    text = Crossover("horizon", "key_door H=32", "gigpo", "grpo").text(rows)
    assert "`grpo`'s falls below `gigpo`'s from k = 14 on (at 16x: `gigpo` 0.931, `grpo` 0.825)" in text
    never = Crossover("horizon", "key_door H=32", "rloo", "grpo").text(rows)  # no bias, more variance
    assert "`grpo`'s is lower at every batch size" in never
    low = Crossover("horizon", "corridor H=32", "gigpo", "rloo").text(rows)  # 0.1 + 6.4/k against 7.1/k
    assert "`rloo`'s falls below `gigpo`'s from k = 7 on" in low


def test_growth_summary_and_flags(rows):
    grow = Growth("horizon", "grpo", ("key_door H=2", "key_door H=32")).text(rows)
    assert grow.startswith("`grpo`'s error grows 82x from `key_door H=2` to `key_door H=32` (0.16 -> 13.2)")
    summary = Summary(("rloo",), ("horizon", "ragged", "staleness"), on_policy=True).text(rows)
    assert "`rloo` scale 0.9 (horizon `corridor H=32`) to 1 (horizon `key_door H=32`)" in summary
    assert "the direction test in 1 of 3 cells" in summary and "on-policy: 4 cells, 1000 batches]" in summary  # not stale=1
    flagged = Flagged("horizon", "corridor H=32").text(rows)
    assert "flags 1 of 3 methods (p < 0.001): `gigpo`; not flagged: `grpo`, `rloo`" in flagged
    assert claims_markdown(rows, [Flagged("horizon", "corridor H=32")]) == f"- {flagged}"


def test_a_claim_whose_cell_is_gone_fails(rows):
    with pytest.raises(KeyError, match="key_door H=64"):
        Ratio("horizon", "key_door H=64", "gigpo", "grpo").text(rows)
    with pytest.raises(KeyError, match="maze"):
        Summary(("rloo",), ("maze",)).text(rows)


def _doc_tables():
    spec = importlib.util.spec_from_file_location("doc_tables", ROOT / "scripts" / "doc_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["doc_tables"] = module
    spec.loader.exec_module(module)
    return module


def test_the_pages_claims_are_the_committed_records():
    """Every claim block is shown in a page and equals what the record gives now."""
    doc_tables = _doc_tables()
    shown = doc_tables.shown()
    for name in DOC_CLAIMS:
        assert shown.get(name), f"claim block {name} is in no page"
        for page in shown[name]:
            text = (ROOT / page).read_text(encoding="utf-8")
            body = next(m["body"] for m in doc_tables.BLOCK.finditer(text) if m["name"] == name)
            assert body == doc_tables.render(name), f"{page}: {name}: run scripts/doc_tables.py"


def test_no_lab_ratio_is_typed_by_hand():
    """Outside the generated blocks, the lab's page and the README's lab paragraph cite no error
    ratio ("3x") and no p-value: those come from the record (code spans, names like
    `nmse 4x`, aside)."""
    doc_tables = _doc_tables()
    lab_page = doc_tables.BLOCK.sub("", (ROOT / "docs/credit_lab.md").read_text(encoding="utf-8"))
    readme = doc_tables.BLOCK.sub("", (ROOT / "README.md").read_text(encoding="utf-8"))
    lab_paragraph = next(line for line in readme.splitlines() if "turnrl credit-lab" in line)
    for where, text in (("docs/credit_lab.md", lab_page), ("README.md", lab_paragraph)):
        typed = re.findall(r"\b\d+(?:\.\d+)?x\b|\bp = \d", re.sub(r"`[^`]*`", "", text))
        assert not typed, f"{where}: {typed}"
