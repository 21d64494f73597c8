"""Routing replay in the Megatron actor at TP 2 with sequence parallelism (right-padded rows) and at
TP 2 + EP 2 with sequence parallelism (packed THD row), in several gloo processes (many_ranks.py,
phase "replay"), against one rank (right-padded) on the same batch of hand-made recorded experts
(fp32):

- every MoE router on every rank routes each recorded token of its own sequence chunk to the
  recorded experts, and the chunks of the TP ranks together cover every recorded token once;
- the routing agreement counts of the recompute, summed over the TP group, equal the one-rank
  counts (and the one-rank count compared is every recorded token in every MoE layer);
- the replayed logprobs and entropy, and the recompute's logprobs, equal the one-rank ones (1e-5).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

REASON = "needs megatron-core 0.19 and megatron-bridge 0.6 (bash requirements/install.sh megatron-cpu)"
pytest.importorskip("megatron.core", reason=REASON)
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip(REASON, allow_module_level=True)

from actor_on_cpu import recorded_experts  # noqa: E402
from many_ranks import EXPERTS, MOE_LAYERS, Layout, routed_batch, run_layout, write_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow

REFERENCE = Layout("replay-tp1", world=1)
LAYOUTS = [
    Layout("replay-tp2-sp", world=2, tp=2, sequence_parallel=True),
    Layout("replay-tp2-ep2-sp-packed", world=2, tp=2, ep=2, sequence_parallel=True, pack_sequences=True),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    checkpoint = write_checkpoint(tmp_path_factory.mktemp("replay-checkpoint"))
    cache: dict[str, dict] = {}

    def run(layout: Layout) -> dict:
        if layout.name not in cache:
            workdir = tmp_path_factory.getbasetemp() / layout.name
            cache[layout.name] = run_layout(layout, checkpoint, workdir, "replay")
        return cache[layout.name]

    return run


def _lengths(batch) -> list[int]:
    return (batch.prompt_mask.sum(1) + batch.response_mask.sum(1)).tolist()


def _tokens_seen(batch, layout: Layout, tp_rank: int) -> list[tuple[int, int] | None]:
    """(row, position in the row's real sequence), or None for padding, of every token the routers
    of TP rank `tp_rank` see in one forward over `batch`: right-padded rows of max prompt + response
    columns (sequence-major) or the rows' real tokens packed into one row, the sequence padded to a
    multiple of TP and split into TP equal chunks."""
    lengths = _lengths(batch)
    if layout.pack_sequences:
        sequence = [[(i, t)] for i, n in enumerate(lengths) for t in range(n)]
    else:
        width = int(batch.prompt_mask.sum(1).max()) + batch.response_ids.shape[1]
        sequence = [[(i, t) if t < n else None for i, n in enumerate(lengths)] for t in range(width)]
    sequence += [[None] * len(sequence[0])] * (-len(sequence) % layout.tp)
    chunk = len(sequence) // layout.tp
    return [token for column in sequence[tp_rank * chunk : (tp_rank + 1) * chunk] for token in column]


def _recorded_tokens(batch) -> int:
    return sum(n - 1 for n in _lengths(batch))


@pytest.mark.parametrize("layout", [REFERENCE, *LAYOUTS], ids=lambda layout: layout.name)
def test_every_router_on_every_rank_takes_the_recorded_experts_of_its_chunk(runs, layout):
    batch = routed_batch()
    lengths = _lengths(batch)
    result = runs(layout)
    assert sorted(r["tp_rank"] for r in result["ranks"]) == sorted(
        rank % layout.tp for rank in range(layout.world)
    )
    checked = 0
    for rank in result["ranks"]:
        seen = _tokens_seen(batch, layout, rank["tp_rank"])
        assert len(rank["routes"]) == MOE_LAYERS
        for layer, (routing_map,) in enumerate(rank["routes"]):
            assert routing_map.shape == (len(seen), EXPERTS), (rank["tp_rank"], layer)
            for token, where in enumerate(seen):
                if where is None or where[1] == lengths[where[0]] - 1:
                    continue  # padding and each row's last token: not recorded
                expected = sorted(recorded_experts(*where, layer, EXPERTS))
                got = routing_map[token].nonzero().flatten().tolist()
                assert got == expected, (
                    f"TP rank {rank['tp_rank']}, MoE layer {layer}, (row, position) {where}"
                )
                checked += 1
    data_parallel = layout.world // layout.tp  # data-parallel replicas each see the whole batch here
    assert checked == _recorded_tokens(batch) * MOE_LAYERS * data_parallel


def test_routing_counts_summed_over_tp_equal_one_rank(runs):
    batch = routed_batch()
    ref = runs(REFERENCE)["recompute"].metrics
    assert ref["routing/num_compared"] == _recorded_tokens(batch) * MOE_LAYERS
    assert ref["routing/num_agreeing"] < ref["routing/num_compared"], (
        "the routers' own choice must differ from the recorded one somewhere, or replay forces nothing"
    )
    for layout in LAYOUTS:
        got = runs(layout)["recompute"].metrics
        for name in ("routing/num_compared", "routing/num_agreeing"):
            assert got[name] == ref[name], f"{layout.name} {name}: {got[name]} vs one rank {ref[name]}"


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.name)
def test_replayed_logprobs_equal_one_rank(runs, layout):
    ref, got = runs(REFERENCE), runs(layout)
    torch.testing.assert_close(got["logprobs"], ref["logprobs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["entropy"], ref["entropy"], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["recompute"].old, ref["recompute"].old, atol=1e-5, rtol=0)
