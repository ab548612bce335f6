"""What a learner sees in JupyterLab, checked in the browser.

Each check returns a list of failures, one line each, saying what was expected and what was seen.
The notebook's model (its outputs' MIME bundles) and the page's DOM are read together, through
`window.jupyterapp` (JupyterLab started with expose_app_in_browser).
"""

from __future__ import annotations

from typing import List

from . import page as P

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# For every output of the notebook: its cell, its MIME types and what the page shows for it.
OUTPUTS_JS = """() => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  const out = [];
  nb.widgets.forEach((cell, i) => {
    if (cell.model.type !== 'code') return;
    const area = cell.outputArea;
    for (let j = 0; j < cell.model.outputs.length; j++) {
      const o = cell.model.outputs.get(j);
      const node = area.widgets[j] ? area.widgets[j].node : null;
      const imgs = node ? [...node.querySelectorAll('img')] : [];
      const json = o.toJSON();
      out.push({cell: i, index: j, type: o.type, mimes: Object.keys(o.data || {}),
                error: o.type === 'error' ? `${json.ename}: ${json.evalue}` : '',
                text: node ? node.textContent.slice(0, 5000) : '',
                widget: !!(node && node.querySelector('.jupyter-widgets, .widget-box')),
                images: imgs.length, imagesShown: imgs.filter(im => im.complete && im.naturalWidth > 0).length,
                svgInline: node ? node.querySelectorAll('svg').length : 0,
                source: cell.model.sharedModel.getSource().slice(0, 80)});
    }
  });
  return out;
}"""


def views_render(page) -> List[str]:
    """Every view's output shows as a live widget: not 'Loading widget…', not its text label."""
    fails = []
    outputs = page.evaluate(OUTPUTS_JS)
    views = [o for o in outputs if WIDGET_VIEW in o["mimes"]]
    if not views:
        fails.append(
            "expected the notebook's views to be live widgets, found no widget output at all"
        )
    for o in views:
        where = f"cell {o['cell']} ({o['source'].splitlines()[0] if o['source'] else ''})"
        if "Loading widget" in o["text"] or "Error displaying widget" in o["text"]:
            fails.append(
                f"{where}: expected the live view, the page says {o['text'].splitlines()[0]!r}"
            )
        elif not o["widget"]:
            fails.append(
                f"{where}: expected the live view, the page shows the text fallback "
                f"{o['text'][:60]!r}"
            )
    for o in outputs:
        if o["type"] == "error":
            fails.append(
                f"cell {o['cell']} ({o['source'].splitlines()[0] if o['source'] else ''}): "
                f"expected no error, got {o['error'][:120]}"
            )
    return fails


def slider_moves_the_picture(page) -> List[str]:
    """Move the first view's slider one step: its picture must change."""
    cell = page.locator(".jp-Cell:has(.widget-slider)").first
    if not cell.count():
        return ["expected a view with a slider, found none"]
    cell.scroll_into_view_if_needed()
    pictures = cell.locator(".widget-html-content")
    before = pictures.evaluate_all("els => els.map(e => e.innerHTML).join('')")
    cell.locator(".widget-slider .noUi-handle").first.click()
    for key in ("ArrowRight", "ArrowLeft", "ArrowLeft"):  # a slider may start at either end
        page.keyboard.press(key)
        P.settle(page, 1.0)
        after = pictures.evaluate_all("els => els.map(e => e.innerHTML).join('')")
        if after != before:
            break
    return (
        []
        if after != before
        else ["expected the picture to change when the slider moved one step, it stayed the same"]
    )


CELLS_JS = """() => window.jupyterapp.shell.currentWidget.content.widgets.map(c => c.model.sharedModel.getSource())"""


def judge_report_is_one_output(page) -> List[str]:
    outputs = page.evaluate(OUTPUTS_JS)
    judged = [i for i, src in enumerate(page.evaluate(CELLS_JS)) if "judge.check(" in src]
    if not judged:
        return ["expected a judge.check cell, found none"]
    mine = [o for o in outputs if o["cell"] == judged[-1]]
    if not mine:
        return ["expected the judge's report, its cell has no output (did Run All stop before it?)"]
    if len(mine) != 1:
        return [
            f"expected the judge's report as one output of the last cell, it has {len(mine)} "
            "outputs"
        ]
    text = mine[0]["text"]
    fails = []
    # "PASSED: ..." or "NOT PASSED: ..."; a learner notebook of stubs: "Not attempted yet, ..."
    if "PASSED" not in text and "Not attempted yet" not in text:
        fails.append(f"expected the judge's verdict in its output, got {text[:80]!r}")
    if "<judge:" in text:
        fails.append("expected no '<judge: ...>' repr after the report, there is one")
    return fails


def figures_show_untrusted(page) -> List[str]:
    """A solution notebook opened as saved (not trusted): every figure shows as a picture."""
    outputs = page.evaluate(OUTPUTS_JS)
    figures = [o for o in outputs if "image/svg+xml" in o["mimes"] or "image/png" in o["mimes"]]
    if not figures:
        return ["expected figures in the saved solution notebook, found none"]
    fails = []
    for o in figures:
        if not (o["imagesShown"] or o["svgInline"]):
            fails.append(f"cell {o['cell']}: expected a figure, the page shows {o['text'][:60]!r}")
    return fails


# Text colour against the colour behind it, WCAG contrast ratio, for every span of the stepper.
CONTRAST_JS = """(root) => {
  const rgb = s => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => { const f = c => { c /= 255; return c <= 0.03928 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4); };
                              return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const behind = el => { for (let e = el; e; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor);
                           if (c.length >= 3 && (c.length < 4 || c[3] > 0.5)) return c; } return [255, 255, 255]; };
  let worst = 99, what = '';
  for (const el of root.querySelectorAll('pre span, pre div, b')) {
    if (!el.textContent.trim()) continue;
    const a = lum(rgb(getComputedStyle(el).color)), b = lum(behind(el));
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    if (ratio < worst) { worst = ratio; what = el.textContent.trim().slice(0, 40); }
  }
  return [worst, what];
}"""


def stepper_readable(page, minimum: float = 3.0) -> List[str]:
    """Every line of the chapter 11 stepper, at every turn, stands out from its background."""
    cell = page.locator(".jp-Cell:has(.widget-toggle-buttons):has(.widget-slider)").filter(
        has_text="slot reuse"
    )
    if not cell.count():
        return ["expected the stepper (the four problems, a slider), found none"]
    cell.scroll_into_view_if_needed()
    cell.locator(".widget-slider .noUi-handle").first.click()
    fails = []
    for _ in range(3):
        page.keyboard.press("ArrowRight")
        P.settle(page, 0.4)
        ratio, what = cell.locator(".widget-vbox").first.evaluate(CONTRAST_JS)
        if ratio < minimum:
            fails.append(
                f"expected every line of the stepper readable (contrast >= {minimum}), "
                f"{what!r} has {ratio:.1f}"
            )
            break
    return fails


def solution_not_saved(page, path, original: bytes) -> List[str]:
    """Run All, then Save (as a learner's Ctrl+S, or the autosave after it): the file on disk must
    not change, and the page must say the notebook is read-only rather than report an error."""
    P.run_all(page)
    # Not awaited: on a read-only notebook JupyterLab answers Save with a dialog that waits for the user.
    page.evaluate("() => { window.jupyterapp.commands.execute('docmanager:save'); }")
    P.settle(page, 2.0)
    fails = []
    if path.read_bytes() != original:
        fails.append(
            "expected the solution notebook unchanged on disk after Run All and Save, it was "
            "rewritten"
        )
    dialogs = page.locator(".jp-Dialog").all_text_contents()
    if any("rror" in d for d in dialogs):
        fails.append(f"expected no error dialog on Save, got {dialogs[0][:100]!r}")
    if not page.get_by_text("read-only").count():
        fails.append("expected JupyterLab to mark the solution notebook read-only, it does not")
    page.keyboard.press("Escape")
    return fails


PROGRESS_CELL = """from minisgl import LLM, SamplingParams
llm = LLM()
print("before")
out = llm.generate(["ROMEO:"] * 16, SamplingParams(max_tokens=24, ignore_eos=True), progress=True)
print("after", sum(len(o["token_ids"]) for o in out))"""


def progress_notebook(path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(PROGRESS_CELL)])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nbformat.write(nb, str(path))


def progress_cleaned_up(page, console: List[str]) -> List[str]:
    """After `generate(progress=True)`: between the prints, one line saying what ran (the bar
    itself gone), and no widget traffic the browser cannot place ("Comm not found")."""
    # rich's Jupyter display leaves empty output areas behind (nothing shows): only text counts
    outputs = [o for o in page.evaluate(OUTPUTS_JS) if o["text"].strip()]
    texts = [o["text"].strip() for o in outputs]
    fails = []
    if len(outputs) != 3:
        fails.append(
            f"expected 3 outputs (a print, the bar's last line, a print), got {len(outputs)}: "
            f"{texts}"
        )
    elif not texts[1].startswith("generated 384 tokens"):
        fails.append(
            f"expected the bar to end as 'generated 384 tokens ...', it shows {texts[1][:80]!r}"
        )
    comm = [m for m in console if "Comm" in m and "not found" in m]
    if comm:
        fails.append(f"expected no 'Comm not found' in the browser's console, got {comm[0][:80]!r}")
    return fails
