"""Every MINISGL_* environment variable of the engine and its tests, in one table: its allowed
values, its default, and what it does. A value outside the allowed ones is an error naming the
variable and the values it takes, never silently the default. (The judge's own variables,
MINISGL_JUDGE_* and MINISGL_MUTANTS_RESULTS, are in judge/settings.py, built the same way.)

The engine's switches are read once, at import, into `ENV`. Each is a `Switch` with a `.value`, so
code holding a reference to `ENV` always sees the current setting, and tests can flip one. Where the
engine has a per-engine setting (`EngineConfig.attention_backend`, `.fused_kernels`, `.cpu_streams`)
the switch is only its default: two engines in one process may differ.

This module imports nothing but the standard library: the judge reads the table without torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Tuple

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class SettingError(ValueError):
    """An environment variable has a value it does not take (the message names both)."""


@dataclass(frozen=True)
class Setting:
    name: str
    doc: str  # one line: what it does
    allowed: Tuple[str, ...] | None = (
        None  # the accepted values (lower case); None: any text (a path)
    )
    default: str | None = None  # the value when unset or empty; None: as `doc` says
    flag: bool = False  # on/off: `allowed` is TRUE + FALSE and the value a bool
    count: bool = False  # a positive integer (its value an int) is allowed besides `allowed`

    def parse(self, raw: str | None):
        """The value of `raw`, the variable's text (None or blank: the default). A flag gives a
        bool,
        a choice its lower-case value, a path its text."""
        text = raw.strip() if raw is not None and raw.strip() else self.default
        if text is None or self.allowed is None:
            return text
        value = text.lower()
        if self.count and value.isdigit() and int(value) > 0:
            return int(value)
        if value not in self.allowed:
            # A typo must not silently mean the opposite of what was meant.
            raise SettingError(f"{self.name}={raw!r}: use one of {self.allowed_text()}")
        return value in TRUE if self.flag else value

    def read(self, environ: Mapping[str, str] | None = None):
        return self.parse((os.environ if environ is None else environ).get(self.name))

    def allowed_text(self) -> str:
        if self.flag:
            return f"{', '.join(TRUE)} (on) or {', '.join(FALSE)} (off)"
        if self.count:
            return f"{', '.join(self.allowed)} or a positive integer"
        return ", ".join(self.allowed) if self.allowed is not None else "a path"


def flag(name: str, default: bool, doc: str) -> Setting:
    return Setting(name, doc, TRUE + FALSE, "1" if default else "0", flag=True)


# ---------------------------------------------------------------------- the engine's switches

DISABLE_OVERLAP_SCHEDULING = flag(
    "MINISGL_DISABLE_OVERLAP_SCHEDULING",
    False,
    "on: the scheduler runs the normal (synchronous) loop instead of the overlap loop (chapter "
    "11); read at "
    "every step by an engine whose `SchedulerConfig.overlap_scheduling` is None (the default)",
)
CPU_STREAMS = Setting(
    "MINISGL_CPU_STREAMS",
    "on a CPU, `deferred` runs work launched on the engine stream only when someone "
    "synchronizes on it, "
    "which makes stream-ordering bugs visible (chapter 11); the default for "
    "`EngineConfig.cpu_streams`",
    ("eager", "deferred"),
    "eager",
)
ATTENTION_BACKEND = Setting(
    "MINISGL_ATTENTION_BACKEND",
    "`auto`: Triton on a CUDA GPU when Triton is installed, else plain torch; the default for "
    "`EngineConfig.attention_backend`",
    ("auto", "torch", "triton"),
    "auto",
)
FUSED_KERNELS = flag(
    "MINISGL_FUSED_KERNELS",
    True,
    "off: no fused Triton norm/RoPE/SiLU kernels even with the Triton backend; the default for "
    "`EngineConfig.fused_kernels`",
)
PDL = flag(
    "MINISGL_PDL",
    True,
    "on: on a Hopper or newer GPU the engine's own Triton kernels start while the one before them "
    "finishes and read their weights meanwhile (programmatic dependent launch, "
    "minisgl/kernel/triton_pdl.py): on an H200 a batch-1 step 0.77 ms against 0.92; off (`0`) "
    "launches every kernel the ordinary way; nothing changes on a CPU or an older GPU; read when "
    "those kernels are first imported",
)

PROGRESS = Setting(
    "MINISGL_PROGRESS",
    "`LLM.generate`'s progress bar (minisgl/llm/progress_bar.py): `auto` shows it for runs that "
    "last, where "
    "someone watches (a terminal, a notebook), never under pytest or CI; `off` never, even "
    "when asked "
    "for (the workbook's own notebook runs use it); `on` whenever asked",
    ("auto", "on", "off"),
    "auto",
)

THREADS = Setting(
    "MINISGL_THREADS",
    "torch's intra-op threads in a process that runs the engine (minisgl/utils/threads.py): "
    "`auto` picks from the model and the machine (one thread for small models, half the cores "
    "for large ones on a CPU; an explicit OMP_NUM_THREADS wins), a number sets it, `keep` leaves "
    "torch's own setting alone",
    ("auto", "keep"),
    "auto",
    count=True,
)

SERVER_INIT = Setting(
    "MINISGL_SERVER_INIT",
    "`module:function` that every process of `python -m minisgl serve` (the API server and its "
    "two workers) and every tensor-parallel rank calls before it builds anything; the judge sets "
    "it so that the learner's code serves, and runs in every rank (minisgl/server/init.py)",
)

TP_TIMEOUT = Setting(
    "MINISGL_TP_TIMEOUT",
    "seconds a tensor-parallel rank waits in a collective for the other ranks before it raises, "
    "naming itself and the collective (minisgl/distributed/ranks.py); the tests make it short, so "
    "a rank that never arrives fails a test instead of hanging it",
    ("600",),
    "600",
    count=True,
)

API_KEY = Setting(
    "MINISGL_API_KEY",
    "the key `python -m minisgl serve` requires as `Authorization: Bearer KEY` on /v1/*, "
    "/tokenize, /detokenize and the server and model info routes (`--api-key` overrides it; "
    "unset: no key)",
)

# ---------------------------------------------------------------------- the tests' settings

TEST_DEVICE = Setting(
    "MINISGL_TEST_DEVICE",
    "the device the tests run the engine on; conftest.py sets it from `--device`",
    ("cpu", "cuda"),
    "cpu",
)
TEST_MODEL = Setting(
    "MINISGL_TEST_MODEL",
    "the checkpoint the tests load (a Hugging Face Qwen3 or Llama folder); "
    "unset: the bundled model",
)
CACHE_DIR = Setting(
    "MINISGL_CACHE_DIR",
    "where the tests keep Hugging Face reference outputs; unset: `.cache/` in the repository",
)

ENGINE_SETTINGS = (
    DISABLE_OVERLAP_SCHEDULING,
    CPU_STREAMS,
    ATTENTION_BACKEND,
    FUSED_KERNELS,
    PDL,
    PROGRESS,
    THREADS,
)
SETTINGS = ENGINE_SETTINGS + (SERVER_INIT, TP_TIMEOUT, API_KEY, TEST_DEVICE, TEST_MODEL, CACHE_DIR)


@dataclass
class Switch:
    name: str
    value: object

    def __bool__(self) -> bool:
        return bool(self.value)


class _Env:
    """The engine's switches as read at import (an invalid value fails the import, naming it)."""

    def __init__(self) -> None:
        self.DISABLE_OVERLAP_SCHEDULING = Switch(
            DISABLE_OVERLAP_SCHEDULING.name, DISABLE_OVERLAP_SCHEDULING.read()
        )
        self.CPU_STREAMS = Switch(CPU_STREAMS.name, CPU_STREAMS.read())
        self.ATTENTION_BACKEND = Switch(ATTENTION_BACKEND.name, ATTENTION_BACKEND.read())
        self.FUSED_KERNELS = Switch(FUSED_KERNELS.name, FUSED_KERNELS.read())
        self.PDL = Switch(PDL.name, PDL.read())
        self.PROGRESS = Switch(PROGRESS.name, PROGRESS.read())
        self.THREADS = Switch(THREADS.name, THREADS.read())

    def reload(self) -> None:
        """Read every switch again: a process forked after the import with another environment (the
        judge's fork server) must see its own."""
        by_name = {s.name: s for s in ENGINE_SETTINGS}
        for switch in vars(self).values():
            switch.value = by_name[switch.name].read()


ENV = _Env()


def markdown_table(settings) -> str:
    """The settings as a Markdown table (the README's list is this, for minisgl's and the
    judge's)."""
    rows = ["| variable | values | default | what it does |", "| --- | --- | --- | --- |"]
    for s in settings:
        values = (
            "`1` / `0` (or true/false, yes/no, on/off)"
            if s.flag
            else (" / ".join(f"`{v}`" for v in s.allowed) if s.allowed else "a path")
        )
        if s.count:
            values += " / a positive integer"
        default = f"`{s.default}`" if s.default else "—"
        rows.append(f"| `{s.name}` | {values} | {default} | {s.doc} |")
    return "\n".join(rows)
