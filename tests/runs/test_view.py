"""The run page (``turnrl view``) in a real browser: Debian's Chromium driven by Playwright
(``executable_path``: Playwright's own browser download is not reachable here). The page of a
real training run opens with no console error, shows each step's groups with the best and worst
episode side by side, colours the known tokens by their figures, its filters and step-over-step
view change what it shows, and hostile model text stays text."""

import copy
import re
import shutil

import pytest
from omegaconf import OmegaConf

from tests.helpers import missing_tool, small_guess_config
from turnrl.cli import main as cli
from turnrl.runs import load_rollouts, rollout_steps
from turnrl.runs.store import write_step
from turnrl.train.loop import train

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CHROMIUM_INSTALL = "apt-get install chromium (Debian), and pip install playwright (the dev extra)"
GREEN, RED, PURPLE = "rgba(46, 160, 67", "rgba(214, 54, 54", "rgba(122, 92, 199"


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        missing_tool("no chromium on PATH", CHROMIUM_INSTALL)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing_tool("playwright is not installed", CHROMIUM_INSTALL)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A real run: 4 steps of 3 tasks x 4 samples on a guessing game small enough to win sometimes,
    evaluations at steps 0, 2 and 4, the page rewritten every 2 steps."""
    cfg = small_guess_config()
    cfg.trainer.rollouts.view_every = 2
    out = tmp_path_factory.mktemp("run")
    train(OmegaConf.to_object(cfg), out)
    return out


def open_page(browser, path):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"file://{path}")
    page.wait_for_selector("body[data-rendered]")
    return page, errors


def rerendered(page, action):
    """Do ``action`` and wait until the page has rendered again."""
    before = page.get_attribute("body", "data-rendered")
    action()
    page.wait_for_function(f"document.body.dataset.rendered !== '{before}'")


def test_the_trainer_writes_the_page_and_it_shows_the_last_step_by_group(browser, run_dir):
    assert (run_dir / "view.html").is_file()
    page, errors = open_page(browser, run_dir / "view.html")
    assert page.inner_text("h1").startswith("turnrl run")
    assert page.eval_on_selector_all("#step option", "os => os.map(o => Number(o.value))") == [1, 2, 3, 4]
    records = list(load_rollouts(run_dir, steps=[4]))
    groups = {r.group_id for r in records}
    assert page.locator(".group").count() == len(groups)
    assert page.locator(".group .pair > .episode").count() == 2 * len(groups)  # best and worst of each
    assert f"{len(records)} of {len(records)} episodes shown in {len(groups)} groups" in page.inner_text("#summary")
    for gid in groups:
        members = sorted((r for r in records if r.group_id == gid), key=lambda r: (-r.reward, r.index))
        shown = page.locator(f'.group[data-group="{gid}"] .pair > .episode')
        assert [int(shown.nth(i).get_attribute("data-episode")) for i in range(2)] == \
            [members[0].index, members[-1].index]
    assert errors == []


def _token_colour(page, record, i):
    episode = page.locator(f'.episode[data-episode="{record.index}"]')
    return episode.locator(".tokens span.t").nth(i).evaluate("s => s.style.background")


def test_tokens_are_coloured_by_the_chosen_figure_and_context_is_grey(browser, run_dir):
    page, errors = open_page(browser, run_dir / "view.html")
    records = list(load_rollouts(run_dir, steps=[4]))
    shown = {int(page.locator(".group .pair > .episode").nth(i).get_attribute("data-episode"))
             for i in range(page.locator(".group .pair > .episode").count())}
    checked = set()
    for r in records:
        if r.index not in shown:
            continue
        tk = r.tokens
        assert page.locator(f'.episode[data-episode="{r.index}"] .tokens span.t').count() == len(tk.ids)
        for i, (sampled, adv) in enumerate(zip(tk.sampled, tk.advantage)):
            colour = _token_colour(page, r, i)
            if not sampled:
                assert colour == "" and "ctx" in page.locator(f'.episode[data-episode="{r.index}"] .tokens span.t').nth(
                    i).get_attribute("class")
                checked.add("context")
            elif adv > 0:
                assert colour.startswith(GREEN), colour
                checked.add("positive")
            elif adv < 0:
                assert colour.startswith(RED), colour
                checked.add("negative")
    assert checked == {"context", "positive", "negative"}  # the run gave both signs somewhere
    rerendered(page, lambda: page.select_option("#metric", "entropy"))
    r = next(r for r in records if r.index in shown)
    i = r.tokens.sampled.index(True)
    assert _token_colour(page, r, i).startswith(PURPLE)
    assert "entropy" in page.inner_text("#legend")
    assert errors == []


def test_filters_steps_and_the_task_view_change_what_is_shown(browser, run_dir):
    page, errors = open_page(browser, run_dir / "view.html")
    records = list(load_rollouts(run_dir, steps=[4]))
    wins = [r for r in records if r.success]
    rerendered(page, lambda: page.select_option("#success", "1"))
    assert f"{len(wins)} of {len(records)} episodes shown" in page.inner_text("#summary")
    assert page.locator(".badge.fail").count() == 0
    rerendered(page, lambda: page.select_option("#success", ""))
    terminations = sorted({r.termination for r in records})
    rerendered(page, lambda: page.select_option("#termination", terminations[0]))
    expected = sum(r.termination == terminations[0] for r in records)
    assert f"{expected} of {len(records)} episodes shown" in page.inner_text("#summary")
    rerendered(page, lambda: page.select_option("#termination", ""))

    rerendered(page, lambda: page.click("#prev"))
    assert page.inner_text("#summary").startswith("step 3 (training)")
    rerendered(page, lambda: page.select_option("#kind", "eval"))
    assert page.eval_on_selector_all("#step option", "os => os.map(o => Number(o.value))") == \
        rollout_steps(run_dir, "eval") == [0, 2, 4]
    evals = list(load_rollouts(run_dir, "eval", steps=[4]))
    assert f"{len(evals)} of {len(evals)} episodes shown" in page.inner_text("#summary")

    # one held-out task at every evaluation: a row per step with its reward
    task = evals[0].task_id
    rerendered(page, lambda: page.locator(".group h3 a", has_text=task).first.click())
    rows = page.locator("#task tr.row")
    assert [int(rows.nth(i).get_attribute("data-step")) for i in range(rows.count())] == [0, 2, 4]
    for i, step in enumerate([0, 2, 4]):
        rewards = [r.reward for r in load_rollouts(run_dir, "eval", steps=[step]) if r.task_id == task]
        cells = rows.nth(i).locator("td")
        assert int(cells.nth(1).inner_text()) == len(rewards)
        assert float(cells.nth(2).inner_text()) == pytest.approx(sum(rewards) / len(rewards), abs=5e-3)
    same_task = sum(r.task_id == task for r in evals)
    assert f"{same_task} of {len(evals)} episodes shown" in page.inner_text("#summary")  # the task filter
    rerendered(page, lambda: rows.nth(0).click())
    at_start = sum(r.task_id == task for r in load_rollouts(run_dir, "eval", steps=[0]))
    assert page.inner_text("#summary").startswith(f"step 0 (held-out): {at_start} of")
    rerendered(page, lambda: page.click("#cleartask"))
    n = len(list(load_rollouts(run_dir, "eval", steps=[0])))
    assert page.inner_text("#summary").startswith(f"step 0 (held-out): {n} of {n} episodes shown")
    assert page.locator("#task tr").count() == 0
    assert errors == []


def test_model_text_is_shown_as_text_never_run(browser, run_dir, tmp_path):
    hostile = '</script><script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
    records = list(load_rollouts(run_dir, steps=[1]))
    bad = copy.deepcopy(records[0])
    i = bad.tokens.sampled.index(True)
    bad.tokens.pieces[i] = hostile
    bad.task_id = hostile
    bad.messages.append({"role": "assistant", "content": hostile})
    target = tmp_path / "run"
    shutil.copytree(run_dir, target)
    write_step(target, "train", 1, [bad, *records[1:]])
    assert cli(["view", str(target)]) == 0
    page, errors = open_page(browser, target / "view.html")
    rerendered(page, lambda: page.select_option("#step", "1"))
    assert page.evaluate("window.pwned") is None
    assert page.locator("img").count() == 0
    assert hostile in page.locator(f'.episode[data-episode="{bad.index}"] .tokens').inner_text()
    assert page.locator(".group h3 a", has_text=re.compile("pwned")).count() == 1
    assert errors == []


def test_view_refuses_a_folder_without_kept_episodes(tmp_path, capsys):
    assert cli(["view", str(tmp_path)]) == 2
    assert "holds no kept episodes" in capsys.readouterr().err


def test_the_screenshot_script_saves_the_page_as_it_shows(browser, run_dir, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "view.png"
    done = subprocess.run([sys.executable, "scripts/view_screenshot.py", str(run_dir), "--out", str(out), "--step",
                           "2", "--metric", "entropy"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(out.read_bytes()[16:20], "big"), int.from_bytes(out.read_bytes()[20:24], "big")
    assert (width, height) == (1400, 1000)
