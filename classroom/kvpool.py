"""The page table, the token pool and the KV pool of a real run, step by step.

`watch(llm)` returns a `PoolRecorder`; call `recorder.snap()` after each `llm.step()` (with the
normal loop, so that no batch is in flight and the state is settled). Each snapshot reads the
engine's public state: the live requests (`llm.live_requests()`), their rows of `llm.page_table`
and `llm.token_pool`, and the cache manager's free list. The engine's event log says what the
step did (which batch ran, which slots and pages were taken and given back).

`show_pool(snapshots)` draws them: one row per request slot with its token ids (token pool) and
KV locations (page table), and below it the KV pool, page by page, coloured by the request that
holds each page. In JupyterLab a slider steps through the run; the static SVG shows a few steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Sequence, Set

from . import svg
from .controls import with_range
from .display import show

PALETTE = ["#9ecae9", "#ffbf86", "#a5d99f", "#f4a3a4", "#c9b3e0", "#d8b9a9", "#f7b6d2", "#c7c7c7"]


@dataclass
class SlotState:
    row: int
    uid: int
    tokens: List[int]  # the token pool row, positions 0 .. device_len - 1
    locations: List[int]  # the page table row, positions 0 .. cached_len - 1 (KV written)
    new_from: int  # first position whose KV this step wrote


@dataclass
class Snapshot:
    step: int
    note: str
    page_size: int
    num_pages: int
    num_slots: int
    max_cols: int
    slots: Dict[int, SlotState]  # row -> what it holds
    free_pages: List[int]
    cached_pages: Set[int] = field(default_factory=set)

    def owner_of_page(self) -> Dict[int, int]:
        owner = {}
        for s in self.slots.values():
            for loc in s.locations:
                owner[loc // self.page_size] = s.uid
        return owner


class PoolRecorder:
    """Collects a Snapshot each time `snap()` is called, with a note made from the events since."""

    def __init__(self, llm, token_text: Callable[[int], str] | None = None) -> None:
        self.llm = llm
        self.snapshots: List[Snapshot] = []
        self.token_text = token_text
        self._events: List = []
        self._seen_cached: Dict[int, int] = {}  # uid -> cached_len at the previous snapshot
        llm.events.subscribe(self._events.append)

    def snap(self) -> Snapshot:
        llm = self.llm
        page_size = llm.engine.page_size
        slots: Dict[int, SlotState] = {}
        for req in llm.live_requests():
            row = req.table_idx
            slots[row] = SlotState(
                row=row,
                uid=req.uid,
                tokens=llm.token_pool[row, : req.device_len].tolist(),
                locations=llm.page_table[row, : req.cached_len].tolist(),
                new_from=self._seen_cached.get(req.uid, 0),
            )
        self._seen_cached = {s.uid: len(s.locations) for s in slots.values()}
        cached = {
            int(loc) // page_size for loc in llm.cache_manager.prefix_cache.all_indices().tolist()
        }
        snap = Snapshot(
            step=len(self.snapshots),
            note=describe(self._events),
            page_size=page_size,
            num_pages=llm.engine.num_pages,
            num_slots=llm.table_manager.capacity,
            max_cols=llm.engine.max_seq_len,
            slots=slots,
            free_pages=llm.cache_manager.free_pages.tolist(),
            cached_pages=cached,
        )
        self._events.clear()
        self.snapshots.append(snap)
        return snap


def watch(llm, token_text: Callable[[int], str] | None = None) -> PoolRecorder:
    """Start recording; the first snapshot (before any step) is taken at once."""
    recorder = PoolRecorder(llm, token_text)
    recorder.snap()
    return recorder


def describe(events: Sequence) -> str:
    """One line about a step, from its events."""
    if not events:
        return "before the first step: every slot and every page is free"
    parts: List[str] = []
    for ev in events:
        if ev.kind == "launch":
            who = ", ".join(str(u) for u in ev["uids"])
            parts.append(f"{ev['phase']} of request{'s' if len(ev['uids']) > 1 else ''} {who}")
        elif ev.kind == "slot_alloc":
            parts.append(f"request {ev['uid']} gets slot {ev['table_idx']}")
        elif ev.kind == "slot_free":
            parts.append(f"request {ev['uid']} finished, slot {ev['table_idx']} is free")
        elif ev.kind == "pages_alloc":
            parts.append(
                f"request {ev['uid']} gets {ev['pages']} page{'s' if ev['pages'] > 1 else ''}"
            )
        elif ev.kind == "pages_free":
            parts.append(f"{ev['pages']} page{'s' if ev['pages'] > 1 else ''} freed")
    return "; ".join(parts) if parts else "nothing to do"


# ---------------------------------------------------------------- drawing

CELL_W, CELL_H, LABEL_W, PAD = 30, 20, 150, 10
TITLE_CHARS = 110  # wrap a step's note after about this many characters
LOC_W = 24  # one location of the KV pool
PAGES_PER_LINE = 8


def color(uid: int) -> str:
    return PALETTE[uid % len(PALETTE)]


def _snapshot_parts(
    snap: Snapshot, top: float, token_text: Callable[[int], str] | None, cols: int
) -> tuple[List[str], float]:
    parts: List[str] = []
    y = top
    title = f"after step {snap.step}: {snap.note}" if snap.step else snap.note
    for line in wrap(title, TITLE_CHARS):
        parts.append(svg.text(PAD, y + 14, line, 12, weight="bold"))
        y += 17
    y += 7
    # column numbers (positions)
    for c in range(cols):
        parts.append(
            svg.text(
                LABEL_W + c * CELL_W + CELL_W / 2,
                y + 10,
                str(c),
                9,
                anchor="middle",
                fill=svg.FAINT,
            )
        )
    y += 14
    for row in range(snap.num_slots):
        s = snap.slots.get(row)
        label = f"slot {row}" + (f" · req {s.uid}" if s else " · free")
        parts.append(svg.text(PAD, y + 14, label, 11, fill=svg.INK if s else svg.FAINT))
        parts.append(svg.text(LABEL_W - 6, y + 14, "tokens", 9, anchor="end", fill=svg.FAINT))
        parts.append(
            svg.text(LABEL_W - 6, y + CELL_H + 14, "KV loc", 9, anchor="end", fill=svg.FAINT)
        )
        for c in range(cols):
            x = LABEL_W + c * CELL_W
            if s is not None and c < len(s.tokens):
                tok = s.tokens[c]
                no_kv = c >= len(s.locations)
                tip = f"position {c}: token {tok}" + (f" {token_text(tok)!r}" if token_text else "")
                tip += " (sampled last: its KV is computed in the next step)" if no_kv else ""
                parts.append(
                    svg.rect(
                        x, y, CELL_W - 2, CELL_H - 2, color(s.uid), rx=2, dash=no_kv, title=tip
                    )
                )
                parts.append(
                    svg.text(
                        x + CELL_W / 2 - 1,
                        y + 13,
                        str(tok),
                        8,
                        anchor="middle",
                        mono=True,
                        fill=svg.ON_BOX,
                    )
                )
            else:
                parts.append(
                    svg.rect(x, y, CELL_W - 2, CELL_H - 2, "#fafafa", stroke="#e3e3e3", rx=2)
                )
            ly = y + CELL_H
            if s is not None and c < len(s.locations):
                loc = s.locations[c]
                new = c >= s.new_from
                tip = (
                    f"position {c}: KV at location {loc} = page {loc // snap.page_size}, "
                    f"offset {loc % snap.page_size}"
                )
                tip += " (written in this step)" if new else ""
                parts.append(
                    svg.rect(
                        x,
                        ly,
                        CELL_W - 2,
                        CELL_H - 2,
                        "white",
                        stroke="#d62728" if new else "#555",
                        rx=2,
                        title=tip,
                    )
                )
                parts.append(
                    svg.text(
                        x + CELL_W / 2 - 1,
                        ly + 13,
                        str(loc),
                        9,
                        anchor="middle",
                        mono=True,
                        fill=svg.ON_BOX,
                    )
                )
            else:
                parts.append(
                    svg.rect(x, ly, CELL_W - 2, CELL_H - 2, "#fafafa", stroke="#e3e3e3", rx=2)
                )
        y += 2 * CELL_H + 8
    # the KV pool
    y += 4
    parts.append(
        svg.text(PAD, y + 12, f"KV pool: {snap.num_pages} pages x {snap.page_size} locations", 11)
    )
    y += 18
    owner = snap.owner_of_page()
    used: Dict[int, Set[int]] = {}
    for s in snap.slots.values():
        for loc in s.locations:
            used.setdefault(loc // snap.page_size, set()).add(loc)
    free = set(snap.free_pages)
    page_w = snap.page_size * LOC_W + 10
    for page in range(snap.num_pages):
        line, k = divmod(page, PAGES_PER_LINE)
        x, py = PAD + k * page_w, y + line * (CELL_H + 22)
        parts.append(svg.text(x, py + 9, f"page {page}", 9, fill=svg.MUTED))
        for off in range(snap.page_size):
            loc = page * snap.page_size + off
            lx = x + off * LOC_W
            if page in owner:
                filled = loc in used.get(page, set())
                fill = color(owner[page]) if filled else "white"
                tip = f"location {loc}: request {owner[page]}" + (
                    "" if filled else " (page held, location not used yet)"
                )
            elif page in snap.cached_pages:
                fill, tip = "#e0e0e0", f"location {loc}: kept by the prefix cache"
            else:
                fill, tip = "white", f"location {loc}: free" if page in free else f"location {loc}"
            parts.append(
                svg.rect(
                    lx,
                    py + 12,
                    LOC_W - 2,
                    CELL_H - 4,
                    fill,
                    stroke="#333" if page in owner else "#bbb",
                    rx=1,
                    title=tip,
                )
            )
            parts.append(
                svg.text(
                    lx + LOC_W / 2 - 1,
                    py + 24,
                    str(loc),
                    8,
                    anchor="middle",
                    mono=True,
                    fill="#111" if page in owner else "#aaa",
                )
            )
    lines = -(-snap.num_pages // PAGES_PER_LINE)
    y += lines * (CELL_H + 22) + 6
    return parts, y


def wrap(text: str, width: int) -> List[str]:
    """Split `text` at "; " (else at spaces) into lines of at most about `width` characters."""
    lines: List[str] = []
    for piece in text.split("; "):
        if lines and len(lines[-1]) + 2 + len(piece) <= width:
            lines[-1] += "; " + piece
        else:
            if lines:
                lines[-1] += ";"
            lines.append(piece)
    return lines


def pool_svg(snapshots: Sequence[Snapshot], token_text: Callable[[int], str] | None = None) -> str:
    """The snapshots one under another."""
    used_cols = max([len(s.tokens) for snap in snapshots for s in snap.slots.values()] + [1])
    cols = min(max(s.max_cols for s in snapshots), used_cols + 1)
    parts: List[str] = []
    y = 6.0
    for snap in snapshots:
        more, y = _snapshot_parts(snap, y, token_text, cols)
        parts.extend(more)
        y += 12
    page_w = snapshots[0].page_size * LOC_W + 10
    width = max(LABEL_W + cols * CELL_W, PAD + PAGES_PER_LINE * page_w) + PAD
    return svg.document(width, y, parts, "page table, token pool and KV pool")


def key_steps(snapshots: Sequence[Snapshot], limit: int = 4) -> List[int]:
    """Steps worth a static picture: the first few where slots changed hands and requests still
    run."""
    picked = [i for i, s in enumerate(snapshots) if i > 0 and s.slots and "slot" in s.note]
    return picked[:limit] or [len(snapshots) - 1]


def show_pool(
    snapshots: Sequence[Snapshot],
    token_text: Callable[[int], str] | None = None,
    static_steps: Sequence[int] | None = None,
) -> None:
    """The run as a static SVG of a few steps; in a live kernel, a widget with a slider over all."""
    steps = list(static_steps) if static_steps is not None else key_steps(snapshots)

    def make_widget():
        import ipywidgets as w

        slider = w.IntSlider(
            min=0,
            max=len(snapshots) - 1,
            value=min(1, len(snapshots) - 1),
            description="step",
            continuous_update=True,
        )
        figure = w.HTML()

        def redraw(_=None) -> None:
            figure.value = pool_svg([snapshots[slider.value]], token_text)

        slider.observe(redraw, "value")
        redraw()
        return w.VBox([with_range(slider), figure])

    show(
        pool_svg([snapshots[i] for i in steps], token_text),
        f"page table and KV pool after steps {steps}",
        make_widget,
    )
