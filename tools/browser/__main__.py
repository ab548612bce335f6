"""The workbook in a real browser: headless Chromium through Playwright, the system's Chromium
(no browser is downloaded). Exit status 0 when every check holds; otherwise one line per failed
check. Screenshots go to --out, for people to look at.

    python -m tools.browser                 # JupyterLab (ch11), the built site (mkdocs build first)
    python -m tools.browser --only lab      # or --only site

JupyterLab: the learner's ch11 notebook, Run All: every view is a live widget, a slider changes its
picture, the judge's report is one output with the verdict; the same in the dark theme, where every
line of the stepper must stand out from its background; then the ch11 solution notebook as saved
(not trusted): every figure visible, and Run All leaves its file as it was; and `LLM.generate`'s
progress bar, gone at the end but for one line. The site: at 390 px (a phone) and 1400 px, light and
dark: no text wider than its column, figures at natural size and reachable, the system's colour
scheme followed, download links that give notebooks, no copy button over an output.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, List

from . import lab, lab_checks, site_checks
from . import page as P

ROOT = lab.ROOT
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    return next((p for p in map(shutil.which, CHROMIUM) if p), None)


class Report:
    def __init__(self, out: Path) -> None:
        self.out, self.failures = out, []

    def check(self, name: str, fn: Callable[[], List[str]]) -> None:
        try:
            fails = fn()
        except Exception as e:  # a page that never got there is a failed check, not a crash
            fails = [f"could not check: {type(e).__name__}: {str(e).splitlines()[0][:160]}"]
        for f in fails:
            self.failures.append(f"{name}: {f}")
        print(
            f"{'ok  ' if not fails else 'FAIL'} {name}" + "".join(f"\n     {f}" for f in fails),
            flush=True,
        )

    def shot(self, page, name: str, locator=None) -> None:
        path = self.out / f"{name}.png"
        (locator or page).screenshot(path=str(path))


def lab_run(pw, chromium: str, report: Report, chapter: str, dark: bool) -> None:
    learner = next((ROOT / "notebooks").glob(f"{chapter}_*.ipynb"))
    theme = lab.DARK if dark else lab.LIGHT
    tag = "dark" if dark else "light"
    with lab.jupyterlab([learner], theme=theme, log=report.out / f"jupyterlab_{tag}.log") as (
        base,
        _,
    ):
        browser, context = P.launch(pw, chromium, dark=dark)
        page = context.new_page()
        P.open_notebook(page, base, learner.name)
        seconds = P.run_all(page)
        print(f"     Run All of {learner.name} ({tag} theme): {seconds:.0f} s", flush=True)
        report.check(f"lab {tag}: every view renders live", lambda: lab_checks.views_render(page))
        if dark:
            report.check(
                "lab dark: the stepper is readable", lambda: lab_checks.stepper_readable(page)
            )
            stepper = page.locator(
                ".jp-Cell:has(.widget-toggle-buttons):has(.widget-slider)"
            ).filter(has_text="slot reuse")
            if stepper.count():
                report.shot(page, "lab_dark_stepper", stepper)
        else:
            report.check(
                "lab light: a slider changes its picture",
                lambda: lab_checks.slider_moves_the_picture(page),
            )
            report.check(
                "lab light: the judge's report is one output with the verdict",
                lambda: lab_checks.judge_report_is_one_output(page),
            )
            last = page.locator(".jp-Notebook .jp-Cell").last
            last.scroll_into_view_if_needed()
            report.shot(page, "lab_judge_report", last)
        browser.close()


def lab_progress(pw, chromium: str, report: Report) -> None:
    scratch = report.out / "progress_check.ipynb"
    lab_checks.progress_notebook(scratch)
    with lab.jupyterlab([scratch], log=report.out / "jupyterlab_progress.log") as (base, _):
        browser, context = P.launch(pw, chromium)
        page = context.new_page()
        console: List[str] = []
        page.on("console", lambda m: console.append(m.text))
        P.open_notebook(page, base, scratch.name)
        P.run_all(page)
        report.check(
            "lab: generate's progress bar is cleaned up",
            lambda: lab_checks.progress_cleaned_up(page, console),
        )
        report.shot(page, "lab_progress", page.locator(".jp-Cell").first)
        browser.close()


def lab_saved_solution(pw, chromium: str, report: Report, chapter: str) -> None:
    """The solution as git has it: figures shown untrusted; then Run All and save: the file stays
    as it was (the repository's JupyterLab config opens solutions read-only)."""
    solution = next((ROOT / "solutions").glob(f"{chapter}_*.ipynb"))
    with lab.jupyterlab(
        [solution], log=report.out / "jupyterlab_solution.log", as_in_repo=True
    ) as (base, served):
        browser, context = P.launch(pw, chromium)
        page = context.new_page()
        P.open_notebook(page, base, f"solutions/{solution.name}")
        P.settle(page, 2.0)
        report.check(
            "lab: a saved solution shows its figures untrusted",
            lambda: lab_checks.figures_show_untrusted(page),
        )
        figure = page.locator(".jp-OutputArea-output:has(img)").last
        if figure.count():
            figure.scroll_into_view_if_needed()
            report.shot(page, "lab_solution_figure")
        report.check(
            "lab: running a solution leaves its file as it was",
            lambda: lab_checks.solution_not_saved(
                page, served / "solutions" / solution.name, solution.read_bytes()
            ),
        )
        browser.close()


def site(pw, chromium: str, report: Report, site_dir: Path, pages: List[str]) -> None:
    if not (site_dir / "index.html").is_file():
        report.failures.append(f"site: {site_dir}/index.html not found (run `mkdocs build` first)")
        print(report.failures[-1])
        return
    browser = pw.chromium.launch(
        executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-gpu"]
    )
    with site_checks.serve(site_dir) as base:
        for width, dark in ((390, False), (390, True), (1400, False)):
            context = browser.new_context(
                viewport={"width": width, "height": 844},
                color_scheme="dark" if dark else "light",
                device_scale_factor=2 if width < 600 else 1,
            )
            page = context.new_page()
            for path in pages:
                tag = (
                    f"{path.strip('/').replace('.html', '') or 'index'} at {width} "
                    f"px{' dark' if dark else ''}"
                )
                report.check(
                    f"site {tag}",
                    lambda: site_checks.check_page(
                        page, f"{base}/{path}", chapter=path.startswith("ch"), dark=dark
                    ),
                )
                name = (
                    f"site_{path.strip('/').replace('.html', '')}_{width}{'_dark' if dark else ''}"
                )
                report.shot(page, name)
                widest = page.locator("img.nb-figure").evaluate_all(
                    "els => els.map(e => e.naturalWidth).indexOf(Math.max(0, ...els.map(e => "
                    "e.naturalWidth)))"
                )
                if widest >= 0:  # the widest figure, where a phone has to scroll
                    page.locator("img.nb-figure").nth(widest).scroll_into_view_if_needed()
                    report.shot(page, name + "_figure")
            context.close()
    browser.close()


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["lab", "site"])
    ap.add_argument("--chapter", default="ch11", help="the notebook JupyterLab runs (default ch11)")
    ap.add_argument("--site", default=ROOT / "site", type=Path)
    ap.add_argument(
        "--pages", nargs="*", default=["index.html", "ch09_radix_cache/", "ch11_overlap/"]
    )
    ap.add_argument("--out", default=ROOT / "build" / "browser_check", type=Path)
    args = ap.parse_args(argv)
    chromium = find_chromium()
    if chromium is None:
        print("no Chromium found (apt-get install chromium): nothing checked")
        return 1
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    report = Report(args.out)
    start = time.time()
    with sync_playwright() as pw:
        if args.only in (None, "lab"):
            lab_run(pw, chromium, report, args.chapter, dark=False)
            lab_run(pw, chromium, report, args.chapter, dark=True)
            lab_saved_solution(pw, chromium, report, args.chapter)
            lab_progress(pw, chromium, report)
        if args.only in (None, "site"):
            site(pw, chromium, report, args.site, args.pages)
    print(
        f"{len(report.failures)} failed check(s) in {time.time() - start:.0f} s; screenshots "
        f"in {args.out}"
    )
    for f in report.failures:
        print(f"FAILED {f}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
