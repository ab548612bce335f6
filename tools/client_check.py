"""Run a real client against `python -m minisgl serve` (not a test, not in CI): lm-eval's
`local-completions`, on the bundled model, with a generate_until and a loglikelihood task made
here from a few lines of Shakespeare (no download), and print what lm-eval reports.

    pip install lm-eval        # not a dependency of this project: install it where you run this
    python tools/client_check.py [--limit 8] [--server-arg ...]

lm-eval's local-completions sends what a real evaluation does: `stop` and `seed` on every request,
and for loglikelihood `echo: true`, `logprobs: 1`, `max_tokens: 0` (or 1 in older releases), with
the prompt as a list. The script fails (exit code 1) on a request the server refuses, which is what
it is for: a field the server does not honour shows up here as lm-eval's error.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minisgl.models import BUNDLED_MODEL  # noqa: E402
from minisgl.server.background import BackgroundServer  # noqa: E402

LINES = [
    ("ROMEO:\nBut soft, what light through yonder", " window breaks?"),
    ("JULIET:\nO Romeo, Romeo! wherefore art", " thou Romeo?"),
    ("HAMLET:\nTo be, or not to be, that", " is the question."),
    ("KING HENRY:\nOnce more unto the breach, dear", " friends, once more;"),
    ("MACBETH:\nTomorrow, and tomorrow, and", " tomorrow,"),
    ("PORTIA:\nThe quality of mercy is not", " strain'd,"),
    ("ANTONY:\nFriends, Romans, countrymen, lend me your", " ears;"),
    ("PROSPERO:\nWe are such stuff as dreams are", " made on,"),
]

TASKS = {
    "minisgl_lines_loglikelihood": {
        "output_type": "loglikelihood",
        "doc_to_text": "{{context}}",
        "doc_to_target": "{{continuation}}",
        "metric_list": [{"metric": "perplexity"}, {"metric": "acc"}],
    },
    "minisgl_lines_generate": {
        "output_type": "generate_until",
        "doc_to_text": "{{context}}",
        "doc_to_target": "{{continuation}}",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 16, "do_sample": False},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
    },
}


def write_tasks(folder: Path) -> None:
    """The data as a JSON-lines file and one lm-eval task YAML per task (YAML is a superset of
    JSON: json.dumps writes valid task files)."""
    data = folder / "lines.jsonl"
    data.write_text("".join(json.dumps({"context": c, "continuation": t}) + "\n" for c, t in LINES))
    for name, spec in TASKS.items():
        task = {
            "task": name,
            "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"test": str(data)}},
            "test_split": "test",
            **spec,
        }
        (folder / f"{name}.yaml").write_text(json.dumps(task, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=len(LINES))
    parser.add_argument("--server-arg", action="append", default=[], help="passed to serve")
    args = parser.parse_args()
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        print("lm-eval is not installed here: pip install lm-eval", file=sys.stderr)
        return 2
    model_dir = Path(BUNDLED_MODEL)
    server_args = ["--device", "cpu", "--dtype", "float32", *args.server_arg]
    with tempfile.TemporaryDirectory() as tmp, BackgroundServer(*server_args) as url:
        write_tasks(Path(tmp))
        model_args = ",".join(
            [
                f"model={model_dir.name}",
                f"base_url={url}/v1/completions",
                f"tokenizer={model_dir}",
                "tokenizer_backend=huggingface",
                "num_concurrent=4",
                "max_retries=1",
            ]
        )
        results = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=model_args,
            tasks=list(TASKS),
            task_manager=TaskManager(include_path=tmp),
            limit=args.limit,
            log_samples=True,
        )
    for name, samples in results["samples"].items():
        print(f"{name}:")
        for sample in samples:
            doc, answer = sample["doc"], sample["filtered_resps"][0]
            print(f"  {doc['context']!r} + {doc['continuation']!r}: {answer!r}")
    for name, metrics in results["results"].items():
        shown = {k: v for k, v in metrics.items() if not k.endswith("stderr,none") and k != "alias"}
        print(f"{name}: {json.dumps(shown)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
