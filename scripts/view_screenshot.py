"""A screenshot of a run's page (``view.html``) in Chromium: the image in the README.

    .venv/bin/python scripts/view_screenshot.py RUN_DIR [--out docs/view.png] [--step N] [--metric advantage]

Writes ``RUN_DIR/view.html`` when the run has none (``python -m turnrl view``), opens it in
Debian's ``chromium`` driven by Playwright (``--chromium`` for another binary), shows the step
(default: the last), colours the tokens by ``--metric`` and saves the window (1400 x 1000 px) as
a PNG. Exits 1, saying so, when the page logs a console error.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from turnrl.runs.view import VIEW_FILE, build_view  # noqa: E402


def screenshot(run_dir: Path, out: Path, chromium: str, step: int | None = None, metric: str = "advantage") -> list[str]:
    """Save the page's window as ``out``; returns the console errors it logged."""
    from playwright.sync_api import sync_playwright

    page_path = run_dir / VIEW_FILE
    if not page_path.is_file():
        build_view(run_dir)
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"file://{page_path.resolve()}")
        page.wait_for_selector("body[data-rendered]")
        for selector, value in (("#step", None if step is None else str(step)), ("#metric", metric)):
            if value is not None and page.input_value(selector) != value:
                before = page.get_attribute("body", "data-rendered")
                page.select_option(selector, value)
                page.wait_for_function(f"document.body.dataset.rendered !== '{before}'")
        page.screenshot(path=str(out))
        browser.close()
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "view.png")
    parser.add_argument("--step", type=int, default=None)
    parser.add_argument("--metric", default="advantage", choices=["advantage", "gap", "importance_weight", "entropy"])
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = parser.parse_args(argv)
    if args.chromium is None:
        parser.error("no chromium on PATH: apt-get install chromium, or pass --chromium PATH")
    errors = screenshot(args.run_dir, args.out, args.chromium, args.step, args.metric)
    if errors:
        print(f"the page logged errors: {errors}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
