"""`python -m minisgl serve` refuses what it cannot serve with one line saying why, and exits."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


SERVE = ("-m", "minisgl", "serve")
SERVE_CH13 = (str(REPO / "judge.py"), "serve", "ch13")  # the learner's code: the judge's command


def serve(*args: str, timeout: float = 120, command=SERVE):
    # the repository first, then whatever the caller had on the path (packages installed there)
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, *command, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def test_a_port_in_use_is_named():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = serve("--port", str(port))
    assert r.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in r.stderr, (
        f"expected exit 1 naming the port in use, got {r.returncode}: {r.stderr.strip()[-200:]}"
    )


def test_a_missing_model_directory_is_named(tmp_path):
    r = serve("--model", str(tmp_path / "nowhere"), "--port", "0")
    assert r.returncode == 2 and "not a directory" in r.stderr, (
        f"expected a usage error naming the directory, got {r.returncode}: "
        f"{r.stderr.strip()[-200:]}"
    )


def test_a_directory_that_is_not_a_model_is_named(tmp_path):
    r = serve("--model", str(tmp_path), "--port", "0")
    assert r.returncode == 1 and "could not start" in r.stderr and "config.json" in r.stderr, (
        f"expected exit 1 saying the model has no config.json, got {r.returncode}: "
        f"{r.stderr.strip()[-300:]}"
    )
    assert "Traceback" not in r.stderr, "a bad model directory deserves one line, not a traceback"


def test_a_request_body_limit_below_one_byte_is_named():
    r = serve("--max-request-bytes", "0", "--port", "0")
    assert r.returncode == 2 and "--max-request-bytes must be at least 1, got 0" in r.stderr, (
        f"expected a usage error naming the option, got {r.returncode}: {r.stderr.strip()[-200:]}"
    )


def test_ctrl_c_stops_every_process():
    """Ctrl-C in a terminal sends SIGINT to the whole foreground process group, workers included."""
    import signal

    import httpx

    from minisgl.server.background import BackgroundServer, wait_gone

    server = BackgroundServer(
        "--max-seq-len", "64", "--num-pages", "256", env={"OMP_NUM_THREADS": "1"}
    )
    server.start()
    try:
        workers = list(httpx.get(server.url + "/health", timeout=30).json()["workers"].values())
        os.killpg(server.proc.pid, signal.SIGINT)
        code = server.proc.wait(30)
    finally:
        server.stop()
    assert code == 0, f"Ctrl-C should stop the server cleanly (exit code 0), got {code}"
    left = wait_gone(workers, 10)
    assert not left, f"after Ctrl-C, worker process(es) {left} still run"
    assert "Traceback" not in "".join(server.log), (
        "Ctrl-C should stop the server quietly, not with a traceback"
    )


def _notebook_with(tmp_path, chapter: str, source: str, exercise: str) -> Path:
    """The chapter's solution notebook with one exercise cell replaced by `source`."""
    import json

    path = next((REPO / "solutions").glob(f"{chapter}_*.ipynb"))
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell.get("metadata", {}).get("minisgl", {}).get("exercise") == f"{chapter}.{exercise}":
            cell["source"] = source
    out = tmp_path / path.name
    out.write_text(json.dumps(nb))
    return out


def test_judge_serve_serves_the_learners_code(tmp_path):
    """`judge.py serve ch13 --notebook NB`: a detokenize of the notebook that always says "stop" is
    what answers (the tokenizer worker is a spawned process of the server)."""
    import openai

    from judge.variant_edits import variant_path, variant_source
    from minisgl.server.background import BackgroundServer

    always_stop = variant_source(variant_path("ch13_finished_is_always_stop"))
    nb = _notebook_with(tmp_path, "ch13", always_stop, "detokenize")
    server = BackgroundServer("--notebook", str(nb), timeout=120, command=SERVE_CH13)
    with server as url:
        first = server.log[0]
        assert first.startswith("minisgl: serving your ch13 code from") and "detokenize" in first, (
            first
        )
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        r = client.completions.create(
            model="shakespeare-qwen3", prompt="ROMEO:\n", max_tokens=3, temperature=0
        )
    assert r.choices[0].finish_reason == "stop", (
        f"3 tokens of max_tokens 3 end with 'length' in the reference; the learner's detokenize "
        f"says 'stop', so the server did not serve it: {r.choices[0].finish_reason!r}"
    )


def test_judge_serve_refuses_code_that_does_not_load(tmp_path):
    nb = _notebook_with(tmp_path, "ch13", "def detokenize(self, msg:\n", "detokenize")
    r = serve("--notebook", str(nb), "--port", "0", command=SERVE_CH13)
    assert r.returncode == 2 and "cannot be served" in r.stderr and "syntax error" in r.stderr, (
        r.stderr[-300:]
    )


def test_judge_serve_refuses_a_file_that_defines_no_exercise(tmp_path):
    f = tmp_path / "mine.py"
    f.write_text("def detokenise(self, msg):\n    return None\n")
    r = serve("--file", str(f), "--port", "0", command=SERVE_CH13)
    assert r.returncode == 2 and "defines none of ch13's exercises" in r.stderr, r.stderr[-300:]
    assert "did you mean" in r.stderr.lower() or "detokenize" in r.stderr, r.stderr[-300:]
