"""Run real clients against `python -m minisgl serve` (not a test, not in CI), on the bundled model,
and print what they got: lm-eval's `local-completions` with a generate_until and a loglikelihood
task made here from a few lines of Shakespeare (no download); LangChain's `ChatOpenAI` and
`OpenAI` (invoke, batch, stream); litellm's `completion` and `text_completion` (plain and
streamed). A client that is not installed is skipped with the install command.

    pip install lm-eval langchain-openai litellm   # not dependencies of this project
    python tools/client_check.py [--limit 8] [--only lm-eval,langchain,litellm] [--server-arg ...]

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


def check_lm_eval(url: str, limit: int) -> None:
    import lm_eval
    from lm_eval.tasks import TaskManager

    model_dir = Path(BUNDLED_MODEL)
    with tempfile.TemporaryDirectory() as tmp:
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
            limit=limit,
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


CHAT = [("user", "Who is there?")]


def check_langchain(url: str, limit: int) -> None:
    from langchain_openai import ChatOpenAI, OpenAI

    common = dict(model=MODEL_NAME, base_url=url + "/v1", api_key="none", max_retries=0)
    chat = ChatOpenAI(**common, max_tokens=12, temperature=0)
    print("ChatOpenAI.invoke:", repr(chat.invoke(CHAT).content))
    print("ChatOpenAI.stream:", repr("".join(c.content for c in chat.stream(CHAT))))
    text = OpenAI(**common, max_tokens=12, temperature=0)
    prompts = [c for c, _ in LINES[: max(1, min(limit, 3))]]
    print("OpenAI.invoke:", repr(text.invoke(prompts[0])))
    print("OpenAI.batch:", [repr(t) for t in text.batch(prompts)])
    print("OpenAI.stream:", repr("".join(text.stream(prompts[0]))))


def check_litellm(url: str, limit: int) -> None:
    import litellm

    common = dict(model="openai/" + MODEL_NAME, api_base=url + "/v1", api_key="none")
    messages = [{"role": role, "content": text} for role, text in CHAT]
    r = litellm.completion(**common, messages=messages, max_tokens=12, temperature=0)
    print("completion:", repr(r.choices[0].message.content), r.usage.total_tokens, "tokens")
    parts = litellm.completion(**common, messages=messages, max_tokens=12, stream=True)
    print("completion, streamed:", repr("".join(p.choices[0].delta.content or "" for p in parts)))
    r = litellm.text_completion(**common, prompt=LINES[0][0], max_tokens=12, temperature=0)
    print("text_completion:", repr(r.choices[0].text))


MODEL_NAME = Path(BUNDLED_MODEL).name
CHECKS = {"lm-eval": check_lm_eval, "langchain": check_langchain, "litellm": check_litellm}
INSTALL = {"lm-eval": "lm-eval", "langchain": "langchain-openai", "litellm": "litellm"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=len(LINES))
    parser.add_argument("--only", default=",".join(CHECKS), help="comma-separated clients")
    parser.add_argument("--server-arg", action="append", default=[], help="passed to serve")
    args = parser.parse_args()
    failed = []
    server_args = ["--device", "cpu", "--dtype", "float32", *args.server_arg]
    with BackgroundServer(*server_args) as url:
        for name in args.only.split(","):
            print(f"== {name}", flush=True)
            try:
                CHECKS[name](url, args.limit)
            except ImportError as e:
                print(f"not installed here ({e.name}): pip install {INSTALL[name]}")
            except Exception as e:  # noqa: BLE001 - a client's refusal is what this looks for
                print(f"FAILED: {type(e).__name__}: {e}")
                failed.append(name)
    print("failed:", ", ".join(failed) if failed else "none")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
