"""roofline.decoding on the CPU in float64: greedy decoding through the KV cache gives the model's greedy tokens,
and speculative decoding gives exactly those tokens whatever the draft (the model itself: every guess kept; a
perturbed copy: some kept; an unrelated model: few), with its counts. The generation ladder on a tiny trained pair."""

import copy
import sys
from pathlib import Path

import pytest
import torch

from roofline import ladder
from roofline.decoding import Steps, greedy, speculative

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from examples.models.llama import Llama, LlamaConfig  # noqa: E402

TINY = dict(vocab_size=64, max_seq=96, n_layer=2, n_head=4, n_kv_head=2, d_model=32, intermediate_size=64)


def _model(seed, **overrides):
    torch.manual_seed(seed)
    return Llama(LlamaConfig(**{**TINY, **overrides})).double().eval()


def _cached(model):
    model.setup_cache(1, 96, torch.float64)
    return model


def _no_cache_greedy(model, prompt, n):
    """The model's greedy tokens by whole forwards over the growing sequence (no cache)."""
    fresh = copy.deepcopy(model)
    for layer in fresh.layers:
        layer.self_attn.kv_cache = None
    sequence = prompt
    for _ in range(n):
        sequence = torch.cat([sequence, fresh(sequence)[:, -1:].argmax(-1)], dim=1)
    return sequence[:, prompt.shape[1]:]


@torch.inference_mode()
def test_greedy_through_the_cache_gives_the_model_s_greedy_tokens():
    model, prompt = _model(0), torch.randint(0, 64, (1, 7))
    expected = _no_cache_greedy(model, prompt, 20)
    assert torch.equal(greedy(Steps(_cached(model), 1, graphs=False), prompt, 20), expected)


@torch.inference_mode()
@pytest.mark.parametrize("k", [1, 3, 6])
def test_speculative_decoding_gives_the_greedy_tokens_whatever_the_draft(k):
    model, prompt = _model(0), torch.randint(0, 64, (1, 7))
    expected = greedy(Steps(_cached(model), 1, graphs=False), prompt, 30)
    perturbed = copy.deepcopy(model)
    with torch.no_grad():
        for p in perturbed.parameters():
            p.add_(torch.randn_like(p) * 0.3 * p.std())
    acceptance = {}
    for name, draft in (("itself", copy.deepcopy(model)), ("perturbed", perturbed),
                        ("unrelated", _model(1, n_layer=1, d_model=16, n_head=2, n_kv_head=1))):
        tokens, stats = speculative(Steps(_cached(model), 1, False), Steps(_cached(draft), 1, False), prompt, 30, k)
        assert torch.equal(tokens, expected), name
        assert stats.proposed == stats.rounds * k and 0 <= stats.accepted <= stats.proposed
        assert stats.accepted + stats.rounds >= 29   # every round gives its kept guesses and one token
        acceptance[name] = stats.acceptance
    assert acceptance["itself"] == 1.0
    assert acceptance["unrelated"] < acceptance["perturbed"] < 1.0


def test_speculative_decoding_refuses_what_it_cannot_do():
    model = _model(0)
    steps = Steps(model, 2, graphs=False)
    with pytest.raises(ValueError, match="a batch of 1"):
        speculative(steps, steps, torch.zeros(2, 3, dtype=torch.long), 5, 2)
    with pytest.raises(ValueError, match="k must be a positive int"):
        speculative(steps, steps, torch.zeros(1, 3, dtype=torch.long), 5, 0)


@pytest.mark.parametrize("family, int8", [("llama", False), ("gpt2", False),
                                          pytest.param("llama", True, marks=[pytest.mark.sweep, pytest.mark.long])],
                         ids=["llama-bf16", "gpt2-bf16", "llama-int8"])
def test_the_generation_ladder_on_a_tiny_trained_pair(tmp_path, family, int8):
    """The int8 rungs run roofline's int8 kernel through Triton's interpreter here (0.6 s a call): in the CI tier,
    two tokens after an 8-token prompt."""
    from dataclasses import replace

    import examples.ladder_tasks as tasks

    task = getattr(tasks, f"{family}_generate")()
    if int8:   # one short prompt: the interpreter's int8 kernel is slow
        first = task.prompt
        task = replace(task, new_tokens=2, check_tokens=2, repeats=6, draft_k=(2,),
                       prompt=lambda device: first(device)[:1, :8])
    else:
        task = replace(task, skip=("int8 weight-only",))
    result = ladder.run(task, device="cpu")
    by_name = {r.rung: r for r in result.rungs}
    assert [r.rung for r in result.rungs] == [r.name for r in ladder.GENERATION_RUNGS] and result.kind == "generate"
    for name in ("CUDA graphs", "int8 + CUDA graphs"):
        assert (by_name[name].status, by_name[name].reason) == ("skipped", "needs a CUDA device")
    base, spec = by_name["bf16 eager"], by_name["speculative decoding"]
    n = task.new_tokens
    assert base.status == "ok" and base.tokens_matched == len(base.tokens) == n and base.vs_baseline == 1.0
    assert spec.config == {"int8": int8, "graphs": False, "speculative": True, "changes": ()}
    assert spec.draft_k in task.draft_k and 0.0 <= spec.acceptance <= 1.0
    assert set(spec.k_sweep_ms) == set(spec.k_sweep_acceptance) == {str(k) for k in task.draft_k}
    assert all(0.0 <= a <= 1.0 for a in spec.k_sweep_acceptance.values())
    # of the tokens generated, the draft's share: its guesses kept, against those and one model token a round
    kept = spec.acceptance * spec.draft_k
    assert spec.draft_share == pytest.approx(kept / (kept + 1))
    assert all(0.0 <= r.agreement <= 1.0 for r in (base, spec))
    assert len(spec.samples_ms) == task.repeats and spec.tokens_per_s == pytest.approx(1e3 / spec.median_ms)
    if int8:   # int8's weights may change the model's choices: the rung says how many leading tokens stayed
        for r in (by_name["int8 weight-only"], spec):
            assert r.status == ("ok" if r.tokens_matched >= n or r.agreement >= task.agreement else "numerics")
    else:      # bf16 throughout: speculative decoding keeps the model's greedy tokens, after every prompt
        assert (spec.status, spec.tokens_matched) == ("ok", n)
        assert spec.generations == base.generations and len(base.generations) == 2
        assert base.tokens == base.generations[0] and all(len(g) == n for g in base.generations)
        assert (by_name["int8 weight-only"].status, by_name["int8 weight-only"].reason) == (
            "skipped", "left out by the task")
    text = ladder.markdown(result)
    assert "tokens = baseline's" in text and "agreement" in text and "guesses kept (k)" in text
    assert f"k={task.draft_k[0]}: {spec.k_sweep_ms[str(task.draft_k[0])]:.3f}, " in text
    ladder.waterfall(result, tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_the_example_prompts_are_the_starts_of_held_out_functions():
    from examples import decoding_pair

    prompts = decoding_pair.prompt("cpu", length=16, count=3)
    assert prompts.shape == (3, 16) and len({tuple(p.tolist()) for p in prompts}) == 3
    assert all(bytes(p.tolist()).startswith(b"def ") for p in prompts)


def test_a_generation_task_s_bad_settings_are_refused():
    with pytest.raises(ValueError, match="at least 6"):
        ladder.GenerateTask("t", model=lambda: None, prompt=lambda d: None, repeats=3)
    with pytest.raises(ValueError, match="draft_k must be positive ints"):
        ladder.GenerateTask("t", model=lambda: None, prompt=lambda d: None, draft_k=(0,))
