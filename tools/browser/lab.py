"""A throwaway JupyterLab server for the browser check.

The notebooks are copied into a scratch folder first, so running them in the browser (which
autosaves) never touches the checkout; the kernel still imports this checkout's `minisgl` and
`judge` (PYTHONPATH). Settings live in a scratch folder too: the theme is chosen there, and the
news and announcement pop-ups that would cover the page are switched off.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List

ROOT = Path(__file__).resolve().parents[2]
DARK = "JupyterLab Dark"
LIGHT = "JupyterLab Light"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(folder: Path, theme: str) -> None:
    def put(plugin: str, name: str, value: dict) -> None:
        path = folder / plugin / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))

    put("@jupyterlab/apputils-extension", "themes", {"theme": theme})
    put(
        "@jupyterlab/apputils-extension",
        "notification",
        {"fetchNews": "false", "checkForUpdates": False},
    )


@contextmanager
def jupyterlab(
    notebooks: List[Path], theme: str = LIGHT, log: Path | None = None, as_in_repo: bool = False
) -> Iterator[str]:
    """Start JupyterLab on copies of `notebooks`; yields its base URL (no token) and the folder
    it serves. `as_in_repo`:
    keep their folders (notebooks/, solutions/) and use the repository's jupyter_server_config.py,
    as `jupyter lab --config=jupyter_server_config.py` does; otherwise all at the top."""
    work = Path(tempfile.mkdtemp(prefix="minisgl-lab-"))
    try:
        (work / "nb").mkdir()
        for nb in notebooks:
            dest = work / "nb" / (nb.relative_to(ROOT) if as_in_repo else nb.name)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(nb, dest)
        _settings(work / "settings", theme)
        port = _free_port()
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            JUPYTERLAB_SETTINGS_DIR=str(work / "settings"),
            JUPYTER_RUNTIME_DIR=str(work / "runtime"),
            MPLBACKEND="agg",
            OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
        )
        for key in [k for k in env if k.startswith("MINISGL_")]:
            env.pop(key)
        out = open(log or os.devnull, "w")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                f"--port={port}",
                "--ip=127.0.0.1",
                f"--ServerApp.root_dir={work / 'nb'}",
                "--IdentityProvider.token=",
                "--ServerApp.password=",
                "--ServerApp.disable_check_xsrf=True",
                "--LabApp.expose_app_in_browser=True",
                "--LabApp.news_url=None",
                "--ServerApp.allow_root=True",
            ]
            + ([f"--config={ROOT / 'jupyter_server_config.py'}"] if as_in_repo else []),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            _wait(base, proc)
            yield base, work / "nb"
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
            out.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _wait(base: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited at start (status {proc.returncode})")
        try:
            urllib.request.urlopen(base + "/api/status", timeout=2)
            return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"JupyterLab did not answer within {timeout:.0f} s")
