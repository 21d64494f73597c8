"""The Megatron actor at TP / EP / DP > 1 in several gloo processes, against one rank (fp32).

Each layout runs the real MegatronActor (many_ranks.py) on the same tiny MLA + MoE checkpoint and
batch as the one-rank reference: the response-rows LM head against the full-vocabulary one on
every rank, logprobs and entropy, every parameter's gradient gathered to full
shape, the exported weights before and after a GRPO minibatch update, and a dist checkpoint that
resumes at the same layout into an identical next step.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

REASON = "needs megatron-core 0.19 and megatron-bridge 0.6 (bash requirements/install.sh megatron-cpu)"
pytest.importorskip("megatron.core", reason=REASON)
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip(REASON, allow_module_level=True)

from many_ranks import Layout, run_layout, write_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow

REFERENCE = Layout("tp1", world=1)
LAYOUTS = [
    Layout("tp2-sp", world=2, tp=2, sequence_parallel=True),
    # Two ranks at EP=2 are also DP=2: the experts' data-parallel group is a single rank.
    Layout("ep2-dp2", world=2, ep=2),
    Layout("tp2-ep2-sp", world=2, tp=2, ep=2, sequence_parallel=True),
    Layout("tp2-ep2-dp2-sp", world=4, tp=2, ep=2, sequence_parallel=True),
    # rlinf's grouped experts (weights read in place from DDP's buffer, their gradient added into
    # main_grad at once) against SequentialMLP on one rank
    Layout("ep2-dp2-grouped", world=2, ep=2, grouped_experts=True),
    Layout("tp2-ep2-sp-grouped", world=2, tp=2, ep=2, sequence_parallel=True, grouped_experts=True),
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("many-ranks-checkpoint"))


@pytest.fixture(scope="module")
def runs(checkpoint, tmp_path_factory):
    cache: dict[tuple[str, str], dict] = {}

    def run(layout: Layout, phase: str = "train") -> dict:
        key = (layout.name, phase)
        if key not in cache:
            cache[key] = run_layout(layout, checkpoint, tmp_path_factory.getbasetemp() / layout.name, phase)
        return cache[key]

    return run


def assert_close_relative(got: dict, want: dict, rel: float, what: str) -> None:
    assert got.keys() == want.keys(), f"{what}: names differ: {sorted(got.keys() ^ want.keys())[:5]}"
    for name, expected in want.items():
        scale = float(expected.abs().max())
        diff = float((got[name] - expected).abs().max())
        assert diff <= rel * scale + 1e-12, f"{what} {name}: max diff {diff:.3g} vs scale {scale:.3g}"


def test_reference_export_equals_the_checkpoint_bit_for_bit(runs, checkpoint):
    from safetensors.torch import load_file

    stored = {}
    for f in sorted(checkpoint.glob("*.safetensors")):
        stored.update(load_file(f))
    exported = runs(REFERENCE)["exported_before"]
    assert exported.keys() == stored.keys()
    for name, tensor in stored.items():
        assert torch.equal(exported[name].to(tensor.dtype), tensor), name


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.name)
def test_layout_equals_one_rank(runs, layout):
    ref, got = runs(REFERENCE), runs(layout)
    # The export before training is the checkpoint, bit for bit, at every layout.
    for name, tensor in ref["exported_before"].items():
        assert torch.equal(got["exported_before"][name], tensor), name
    torch.testing.assert_close(got["logprobs"], ref["logprobs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["entropy"], ref["entropy"], atol=1e-5, rtol=0)
    assert ref["grads"], "the reference caught no gradient"
    assert_close_relative(got["grads"], ref["grads"], 1e-4, "gradient")
    assert_close_relative(got["exported_step1"], ref["exported_step1"], 1e-5, "weights after one update")
    assert got["metrics_step1"]["actor/loss"] == pytest.approx(ref["metrics_step1"]["actor/loss"], abs=1e-6)


@pytest.mark.parametrize("layout", [REFERENCE, *LAYOUTS], ids=lambda layout: layout.name)
def test_response_rows_lm_head_equals_the_full_vocabulary_head_on_every_rank(runs, layout):
    """Under sequence parallelism the hidden states are gathered over TP before the response rows
    are picked; a wrong backward of that gather (a reduce-scatter on top of the output layer's
    all-reduce) would double every gradient below the LM head."""
    result = runs(layout)["lm_head"]
    for form in ("padded", "packed"):
        assert len(result[form]) == layout.world
        for rank, diffs in enumerate(result[form]):
            where = f"{form}, rank {rank}: {diffs}"
            assert diffs["nonzero_grads"] > 10, where
            assert diffs["logprobs"] <= 1e-5 and diffs["entropy"] <= 1e-5 and diffs["masked_zero"] == 0, where
            assert diffs["grads"] <= 1e-5, where


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.name)
def test_checkpoint_resumes_at_the_same_layout_into_the_same_step(runs, layout):
    uninterrupted, resumed = runs(layout), runs(layout, "resume")
    assert resumed["metrics_step2"] == uninterrupted["metrics_step2"]
    for name, tensor in uninterrupted["exported_step2"].items():
        assert torch.equal(resumed["exported_step2"][name], tensor), name
