"""The draft-model drafter (minisgl/speculative/draft_model.py): greedy proposals from its own
paged KV, rolled back where the target rejected, pages all returned on release, and a draft with
another vocabulary refused by name. The bundled model serves as its own draft here: its greedy
continuation (Hugging Face's, float32) is what every proposal must equal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from helpers import MODEL, hf_greedy, prompt_ids, test_device
from minisgl.core import Req, SamplingParams, current_ctx
from minisgl.engine import EngineConfig
from minisgl.speculative.draft_model import DraftModelDrafter, check_draft_matches_target

K = 5


def target_config(page_size: int = 1, model=MODEL, **kw) -> EngineConfig:
    options = dict(
        dtype=torch.float32,
        device=test_device(),
        max_running_req=8,
        num_page_override=512 // page_size,
        max_seq_len_override=256,
        page_size=page_size,
    )
    options.update(kw)
    return EngineConfig(model, **options)


def req(ids, uid: int) -> Req:
    return Req(torch.tensor(ids, dtype=torch.int32), 0, 0, 32, uid, SamplingParams())


def held_pages_agree(drafter: DraftModelDrafter) -> None:
    """Every page is free or held by exactly one request, and a request holds exactly the pages
    its cached tokens need."""
    held = [p for e in drafter.cached.values() for p in e.pages]
    assert sorted(held + drafter.free_pages) == list(range(drafter.num_pages))
    for uid, e in drafter.cached.items():
        want = -(-len(e.tokens) // drafter.page_size)
        assert len(e.pages) == want, f"uid {uid}: {len(e.tokens)} tokens hold {len(e.pages)} pages"


@pytest.fixture(scope="module")
def prompts():
    # different lengths, one a prefix of another (the third is the first's start)
    return prompt_ids()


@pytest.mark.parametrize("page_size", [1, 4])
def test_proposals_are_the_drafts_greedy_continuation(prompts, page_size):
    drafter = DraftModelDrafter(MODEL, target_config(page_size))
    want = hf_greedy(prompts, K)
    got = drafter.propose([req(p, uid) for uid, p in enumerate(prompts)], K)
    assert got == want, f"page_size {page_size}: draft proposals {got} != greedy {want}"
    held_pages_agree(drafter)
    # each request now caches its tokens and the first K - 1 drafts (the last was never run)
    for uid, p in enumerate(prompts):
        assert drafter.cached[uid].tokens == p + want[uid][: K - 1]


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("accepted", [0, 2, K])
def test_after_a_rejection_the_proposal_is_a_fresh_drafters(prompts, page_size, accepted):
    """The target accepted `accepted` drafts and then put its own token: the cached KV past the
    accepted prefix must go, and the next proposal be what a drafter that never saw the rejected
    tokens proposes."""
    drafter = DraftModelDrafter(MODEL, target_config(page_size))
    first = drafter.propose([req(p, uid) for uid, p in enumerate(prompts)], K)
    # a correction token that is not the draft's: the draft's own next token plus one
    follow = [p + d[:accepted] + [(d + [0])[accepted] + 1] for p, d in zip(prompts, first)]
    got = drafter.propose([req(f, uid) for uid, f in enumerate(follow)], K)
    fresh = DraftModelDrafter(MODEL, target_config(page_size))
    want = fresh.propose([req(f, uid) for uid, f in enumerate(follow)], K)
    assert got == want, f"accepted {accepted}: rolled-back proposals {got} != fresh {want}"
    assert want == hf_greedy(follow, K)
    held_pages_agree(drafter)


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_history_changed_in_the_middle_keeps_only_the_common_prefix(prompts, page_size):
    """The drafter compares tokens, not lengths: a request whose tokens differ from what it
    cached before the end (here the same uid with another text after its first 3 tokens) keeps
    the KV of the common prefix only."""
    drafter = DraftModelDrafter(MODEL, target_config(page_size))
    drafter.propose([req(prompts[0], 0)], K)
    changed = prompts[0][:3] + prompts[1]
    got = drafter.propose([req(changed, 0)], K)
    assert got == hf_greedy([changed], K), "KV of tokens past the common prefix was kept"
    held_pages_agree(drafter)


@pytest.mark.parametrize("page_size", [1, 4])
def test_release_returns_every_page(prompts, page_size):
    drafter = DraftModelDrafter(MODEL, target_config(page_size))
    reqs = [req(p, uid) for uid, p in enumerate(prompts)]
    drafter.propose(reqs, K)
    assert drafter.num_free_pages < drafter.num_pages
    # a shorter history (everything after the prompt's first token rejected) rolls pages back
    before = drafter.num_free_pages
    drafter.propose([req(prompts[0][:1], 0)], 1)
    assert drafter.num_free_pages > before
    held_pages_agree(drafter)
    for r in reqs:
        drafter.release(r)
    drafter.release(req([1], 99))  # never proposed for: holds nothing
    assert drafter.num_free_pages == drafter.num_pages
    assert sorted(drafter.free_rows) == list(range(8)) and not drafter.cached


def test_a_full_pool_drops_idle_requests_not_this_calls(prompts):
    """The draft KV is only a cache: a pool too small for every request at once evicts those not
    in the call, and their next proposal is still right."""
    # 10 pages of 4; the four requests need 5, 5, 3 and 3 of them (prompt + K - 1 drafts)
    drafter = DraftModelDrafter(MODEL, target_config(4), num_tokens=40)
    want = hf_greedy(prompts, K)
    for uid, p in enumerate(prompts):
        assert drafter.propose([req(p, uid)], K) == [want[uid]]
        held_pages_agree(drafter)
    assert drafter.cached[0].tokens == [], "the least recently used request keeps its KV"
    assert drafter.propose([req(prompts[0], 0)], K) == [want[0]]
    too_many = [req(p + want[i], 10 + i) for i, p in enumerate(prompts)]
    with pytest.raises(RuntimeError, match="out of KV pages"):
        DraftModelDrafter(MODEL, target_config(4), num_tokens=16).propose(too_many, K)


def test_the_context_end_caps_the_draft(prompts):
    drafter = DraftModelDrafter(MODEL, target_config(1), max_seq_len=len(prompts[0]) + 2)
    got = drafter.propose([req(prompts[0], 0)], K)
    assert got == [hf_greedy([prompts[0]], 3)[0]]  # drafts at positions len, len + 1, len + 2


def test_a_scheduler_config_serves_as_the_targets(prompts):
    """The LLM option passes its SchedulerConfig (an EngineConfig with scheduler fields); the
    draft's engine takes the engine fields only."""
    from minisgl.scheduler.config import SchedulerConfig

    options = vars(target_config(4)) | dict(cache_type="naive")
    drafter = DraftModelDrafter(MODEL, SchedulerConfig(**options))
    assert drafter.propose([req(prompts[1], 0)], K) == hf_greedy([prompts[1]], K)
    assert type(drafter.engine.config) is EngineConfig


def test_bad_calls_are_refused(prompts):
    drafter = DraftModelDrafter(MODEL, target_config(1))
    assert drafter.propose([req(prompts[0], 0)], 0) == [[]]
    for k in (-1, 1.5, True):
        with pytest.raises(ValueError, match="k \\(draft tokens per request\\)"):
            drafter.propose([req(prompts[0], 0)], k)
    with pytest.raises(ValueError, match="same request twice"):
        drafter.propose([req(prompts[0], 3), req(prompts[1], 3)], 2)
    with pytest.raises(TypeError, match="target's EngineConfig"):
        DraftModelDrafter(MODEL, str(MODEL))


def test_building_it_leaves_the_targets_context_and_threads(prompts):
    from minisgl.engine import Engine

    target = Engine(target_config(1))
    context, threads = current_ctx(), torch.get_num_threads()
    assert context is target.ctx
    torch.set_num_threads(2)
    try:
        DraftModelDrafter(MODEL, target_config(1))
        assert current_ctx() is target.ctx
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def _model_copy(tmp_path, name: str):
    out = tmp_path / name
    shutil.copytree(MODEL, out, ignore=shutil.ignore_patterns("*.safetensors"))
    return out


def test_a_draft_with_another_vocabulary_is_refused_by_name(tmp_path):
    wrong = _model_copy(tmp_path, "wide-vocab")
    config = json.loads((wrong / "config.json").read_text())
    config["vocab_size"] = 5000
    (wrong / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="5000 tokens.* 4096") as e:
        check_draft_matches_target(wrong, MODEL)
    assert "wide-vocab" in str(e.value) and "share the target's tokenizer" in str(e.value)
    with pytest.raises(ValueError, match="5000"):  # the drafter checks before loading weights
        DraftModelDrafter(wrong, target_config(1))


def test_a_draft_with_another_tokenizer_of_the_same_size_is_refused(tmp_path):
    wrong = _model_copy(tmp_path, "swapped-tokens")
    tok = json.loads((wrong / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (wrong / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="different tokenizers") as e:
        check_draft_matches_target(wrong, MODEL)
    assert repr(a) in str(e.value) or repr(b) in str(e.value)
    check_draft_matches_target(MODEL, MODEL)  # the same model passes


def test_a_hybrid_draft_is_refused_by_name():
    from hybrid_checkpoints import hybrid_checkpoint

    with pytest.raises(ValueError, match="Gated DeltaNet.*rolled back"):
        DraftModelDrafter(hybrid_checkpoint("qwen3_5"), target_config(1))


def test_the_bundled_draft_drafts_for_the_bundled_model():
    """minisgl/assets/shakespeare-qwen3-draft (tools/train_model/README.md): same tokenizer as the
    bundled target, and its proposals are its own greedy continuation."""
    from minisgl.models import BUNDLED_MODEL

    target = Path(BUNDLED_MODEL)
    draft = target.parent / "shakespeare-qwen3-draft"
    check_draft_matches_target(draft, target)
    drafter = DraftModelDrafter(draft, target_config(4, model=target))
    ids = prompt_ids(model=target)
    got = drafter.propose([req(p, uid) for uid, p in enumerate(ids)], K)
    assert got == hf_greedy(ids, K, model=draft)
