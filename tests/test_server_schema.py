"""/openapi.json says what `python -m minisgl serve` does: a bounded schemathesis run against a live
server (loopback, a fixed seed, a bounded number of examples per operation) finds no failing
check: no 5xx, every status and content type declared, every body as declared, every request the
schema calls invalid refused. Schemathesis is in the [dev] extra; its CLI is run, not its pytest
plugin (pyproject.toml turns that off: it costs every pytest start seconds)."""

from __future__ import annotations

import shutil
import subprocess

from extras import needs_extra

CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
    ]
)
SEED = 44
EXAMPLES = 10  # per operation and phase: about 900 requests, a minute or two on a CPU


@needs_extra("dev", "schemathesis")
def test_a_bounded_schemathesis_run_finds_nothing(server, tmp_path):
    cli = shutil.which("schemathesis") or shutil.which("st")
    assert cli is not None, "schemathesis is importable but its command is not on PATH"
    run = subprocess.run(
        [
            cli,
            "run",
            f"{server.url}/openapi.json",
            "--checks",
            CHECKS,
            "--max-examples",
            str(EXAMPLES),
            "--seed",
            str(SEED),
            "--request-timeout",
            "120",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # its reports and cassettes, if any, stay out of the tree
        timeout=900,
    )
    assert run.returncode == 0, f"schemathesis failed:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
