"""The radix prefix cache, drawn (chapter 9).

`snapshot(cache, caption)` copies a `RadixPrefixCache`'s tree into plain data: every node's key
(its tokens), value (their KV locations), lock count and last access. A list of snapshots taken
after each operation (insert, match, lock, evict, or one engine step) is a *film* of the tree:
`show_film` draws it as SVG frames, and in JupyterLab adds a slider that steps through them.
`text_tree` gives the same tree as text, for outputs a test can compare.

Nodes are told apart across frames by their path: the tokens from the root to the end of the
node. A node whose path is new in a frame is drawn with a thick border.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from typing import Callable, Dict, List, Sequence, Tuple

from . import svg
from .controls import with_range
from .display import show

TokenText = Callable[[int], str]

LOCKED, EVICTABLE, ROOT = "#fdd49e", "#c7e9c0", "#e0e0e0"


@dataclass
class NodeView:
    key: Tuple[int, ...]
    value: List[int]
    ref_count: int
    last_access: int
    path: Tuple[int, ...]  # every token from the root to the end of this node
    children: List["NodeView"] = field(default_factory=list)

    def walk(self) -> List["NodeView"]:
        out, stack = [], [self]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(node.children))
        return out


@dataclass
class Frame:
    caption: str
    root: NodeView
    evictable: int
    protected: int


def _copy(node, path: Tuple[int, ...]) -> NodeView:
    full = path + tuple(node.key)
    view = NodeView(
        tuple(node.key),
        [int(x) for x in node.value.tolist()],
        node.ref_count,
        node.last_access,
        full,
    )
    view.children = [_copy(child, full) for child in node.children.values()]
    return view


def snapshot(cache, caption: str = "") -> Frame:
    """The tree of `cache` (a RadixPrefixCache) as it is now."""
    return Frame(caption, _copy(cache.root, ()), cache.evictable_size, cache.protected_size)


# ---------------------------------------------------------------- text


def token_label(tokens: Sequence[int], token_text: TokenText | None, limit: int = 33) -> str:
    """Tokens as text: '|' between tokens, '·' for a space, '↵' for a newline (so that a token's
    leading space stays visible); long keys are cut with '…'."""
    if token_text is None:
        s = " ".join(map(str, tokens))
    else:
        s = "|".join(token_text(t).replace("\n", "↵").replace(" ", "·") for t in tokens)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def locations(values: Sequence[int]) -> str:
    """[7, 8, 9, 10] -> '7-10'; anything not one run is listed (shortened)."""
    if not values:
        return "-"
    if list(values) == list(range(values[0], values[0] + len(values))):
        return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"
    shown = ",".join(map(str, values[:4]))
    return shown + (",…" if len(values) > 4 else "")


def text_tree(frame: Frame, token_text: TokenText | None = None) -> str:
    lines = [f"root   (evictable {frame.evictable}, protected {frame.protected} tokens)"]

    def visit(node: NodeView, prefix: str) -> None:
        for i, child in enumerate(node.children):
            last = i == len(node.children) - 1
            lock = f"locked x{child.ref_count}" if child.ref_count else "evictable"
            lines.append(
                f"{prefix}{'└─' if last else '├─'} {token_label(child.key, token_text, 60)!r}  "
                f"locs {locations(child.value)}  {lock}  t={child.last_access}"
            )
            visit(child, prefix + ("   " if last else "│  "))

    visit(frame.root, "")
    return "\n".join(lines)


# ---------------------------------------------------------------- drawing

BOX_W, BOX_H, COL_GAP, ROW_H, LEFT, HEAD = 230, 38, 34, 46, 10, 42


def _layout(root: NodeView) -> Dict[int, Tuple[int, float]]:
    """id(node) -> (depth, row): leaves on consecutive rows, a parent centred on its children."""
    pos: Dict[int, Tuple[int, float]] = {}
    next_row = [0]

    def place(node: NodeView, depth: int) -> float:
        if not node.children:
            row = float(next_row[0])
            next_row[0] += 1
        else:
            rows = [place(c, depth + 1) for c in node.children]
            row = (rows[0] + rows[-1]) / 2
        pos[id(node)] = (depth, row)
        return row

    place(root, 0)
    return pos


def frame_svg(
    frame: Frame, token_text: TokenText | None = None, before: Frame | None = None, title: str = ""
) -> str:
    """One frame: the tree from left (root) to right. Locked nodes orange, evictable green; a
    node that is new since `before` has a thick border."""
    pos = _layout(frame.root)
    nodes = frame.root.walk()
    old_paths = {n.path for n in before.root.walk()} if before is not None else set()
    depth = max(d for d, _ in pos.values())
    rows = max(r for _, r in pos.values()) + 1
    width = max(LEFT + 50 + depth * (BOX_W + COL_GAP) + 20, 560)
    height = HEAD + rows * ROW_H + 8

    def xy(node: NodeView) -> Tuple[float, float]:
        d, r = pos[id(node)]
        x = LEFT if d == 0 else LEFT + 50 + COL_GAP + (d - 1) * (BOX_W + COL_GAP)
        return x, HEAD + r * ROW_H

    parts = [svg.text(LEFT, 16, title or frame.caption, 12, weight="bold")]
    parts.append(
        svg.text(
            LEFT,
            31,
            f"evictable {frame.evictable} · protected {frame.protected} tokens "
            "(orange: locked, green: evictable, thick border: new)",
            10,
            fill=svg.MUTED,
        )
    )
    for node in nodes:  # edges first, under the boxes
        x, y = xy(node)
        right = x + (50 if node is frame.root else BOX_W)
        for child in node.children:
            cx, cy = xy(child)
            parts.append(svg.line(right, y + BOX_H / 2, cx, cy + BOX_H / 2, stroke="#888"))
    for node in nodes:
        x, y = xy(node)
        if node is frame.root:
            parts.append(svg.rect(x, y, 50, BOX_H, ROOT, rx=6))
            parts.append(svg.text(x + 25, y + 23, "root", 11, anchor="middle", fill=svg.ON_BOX))
            continue
        fresh = before is not None and node.path not in old_paths
        fill = LOCKED if node.ref_count else EVICTABLE
        tip = (
            f"key {list(node.key)}\nlocations {node.value}\nref_count {node.ref_count}, "
            f"last access {node.last_access}"
        )
        parts.append(
            svg.rect(x, y, BOX_W, BOX_H, fill, stroke="#111" if fresh else "#666", title=tip)
        )
        if fresh:
            parts.append(svg.rect(x + 1.5, y + 1.5, BOX_W - 3, BOX_H - 3, "none", stroke="#111"))
        parts.append(
            svg.text(
                x + 6, y + 15, token_label(node.key, token_text), 11, mono=True, fill=svg.ON_BOX
            )
        )
        lock = f"locked x{node.ref_count}" if node.ref_count else "evictable"
        meta = f"{len(node.key)} tok · locs {locations(node.value)} · {lock} · t={node.last_access}"
        parts.append(svg.text(x + 6, y + 30, meta, 9, fill="#444"))
    return svg.document(width, height, parts, frame.caption)


def film_svg(frames: Sequence[Frame], token_text: TokenText | None = None, title: str = "") -> str:
    """Every frame, one under another, numbered."""
    import re

    parts, y, width = [], 0.0, 0.0
    for i, frame in enumerate(frames):
        fig = frame_svg(
            frame, token_text, frames[i - 1] if i else None, title=f"{i + 1}. {frame.caption}"
        )
        m = re.match(r"<svg [^>]*width='(\d+)' height='(\d+)'", fig)
        w, h = float(m[1]), float(m[2])
        inner = fig[fig.index(">") + 1 : fig.rindex("</svg>")]
        parts.append(f"<g transform='translate(0,{y:.0f})'>{inner}</g>")
        parts.append(svg.line(0, y + h + 4, max(w, 400), y + h + 4, stroke=svg.RULE))
        y += h + 10
        width = max(width, w)
    return svg.document(max(width, 400), y, parts, title or "radix tree, step by step")


def show_film(
    frames: Sequence[Frame], token_text: TokenText | None = None, title: str = "radix tree"
) -> None:
    """All frames as one SVG; in a live kernel, a slider that shows one frame at a time."""

    def make_widget():
        import ipywidgets as w

        slider = w.IntSlider(min=1, max=len(frames), value=1, description="frame")
        figure, text = w.HTML(), w.HTML()

        def redraw(_=None) -> None:
            i = slider.value - 1
            figure.value = frame_svg(
                frames[i],
                token_text,
                frames[i - 1] if i else None,
                title=f"{i + 1}/{len(frames)}. {frames[i].caption}",
            )
            text.value = (
                f"<pre style='font-size:11px'>{escape(text_tree(frames[i], token_text))}</pre>"
            )

        slider.observe(redraw, "value")
        redraw()
        return w.VBox([with_range(slider), figure, text])

    show(film_svg(frames, token_text, title), title, make_widget)


# ---------------------------------------------------------------- the tree inside a running engine


class EngineFilm:
    """Films the prefix cache of a running `LLM`: `step()` turns the loop once and, if the tree
    changed, adds a frame whose caption says what the step did (read from the event log)."""

    def __init__(self, llm, token_text: TokenText | None = None) -> None:
        self.llm, self.token_text = llm, token_text
        self.cache = llm.cache_manager.prefix_cache
        self.page_size = llm.cache_manager.page_size
        self.prompt_lens: Dict[int, int] = {}
        self.frames: List[Frame] = [snapshot(self.cache, "an empty cache")]
        self._events: List = []
        llm.events.subscribe(self._events.append)

    def add(self, prompt, params) -> int:
        uid = self.llm.add_request(prompt, params)
        self.prompt_lens[uid] = len(self.llm.encode(prompt))
        return uid

    def _caption(self) -> str:
        launch = next((e for e in self._events if e.kind == "launch"), None)
        if launch is None:
            return "no batch"
        before = self._events[: self._events.index(launch)]
        after = self._events[self._events.index(launch) :]
        words = [f"step {launch['step']}: {launch['phase']} of {launch['uids']}"]
        evicted = sum(e["pages"] for e in before if e.kind == "pages_free")
        if evicted:
            words.append(f"{evicted} page(s) evicted to make room")
        if launch["phase"] == "prefill":
            new = {}
            for e in before:
                if e.kind == "pages_alloc":
                    new[e["uid"]] = new.get(e["uid"], 0) + e["pages"]
            for uid in launch["uids"]:
                n = self.prompt_lens.get(uid)
                computed = new.get(uid, 0) * self.page_size
                if n is not None and self.page_size == 1:
                    words.append(f"req {uid}: {n - computed} of {n} prompt tokens from the cache")
        done = [m.uid for e in after if e.kind == "send" for m in e["msgs"] if m.finished]
        if done:
            words.append(f"{done} finished")
        return "; ".join(words)

    def step(self) -> None:
        self._events.clear()
        before = text_tree(self.frames[-1])
        self.llm.step()
        frame = snapshot(self.cache, self._caption())
        if text_tree(frame) != before:
            self.frames.append(frame)

    def run_until_idle(self, limit: int = 500) -> None:
        for _ in range(limit):
            if not self.llm.busy:
                return
            self.step()
        raise RuntimeError("the loop did not go idle")
