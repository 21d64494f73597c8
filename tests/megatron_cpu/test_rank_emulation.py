"""benchmarks/actor_throughput.py --emulate-rank on the CPU: one rank of the Moonlight recipe's
layout (TP=8, EP=8, ETP=1, SP) built by megatron-core in one process, its collectives emulated
(benchmarks/rank_emulation.py). Its parameters are the memory plan's rank shapes, part by part,
and its modules see the token counts one rank of the real layout sees (docs/moonlight.md, 6)."""

from __future__ import annotations

import importlib.util
import json

import pytest

REASON = "needs megatron-core 0.19 and megatron-bridge 0.6 (bash requirements/install.sh agentic ...)"
pytest.importorskip("megatron.core", reason=REASON)
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip(REASON, allow_module_level=True)

from emulated_rank import FIXTURE, MICRO_BATCH, PROMPT, RESPONSE, TINY, run_emulated_rank  # noqa: E402

from rlinf.models.memory_plan import rank_parts  # noqa: E402
from rlinf.models.slice import moonlight_slice_config  # noqa: E402

TOKENS = MICRO_BATCH * (PROMPT + RESPONSE)  # T, one micro-batch
TOP_K, EP, TP = 6, 8, 8


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    return run_emulated_rank(tmp_path_factory.mktemp("emulated-rank"))


def planned(hf: dict) -> dict[str, dict[str, int]]:
    # The TE-free spec (this machine's) splits the KV down-projection; TE's keeps it whole.
    return {
        part: {"replicated": p.replicated, "tensor_parallel": p.tensor_parallel, "experts": p.experts}
        for part, p in rank_parts(hf, tp=TP, ep=EP, etp=1, kv_down_split=True).items()
    }


def test_the_full_size_rank_holds_the_memory_plans_rank_shapes(emulated):
    moonlight = json.loads(FIXTURE.read_text())
    assert emulated["moonlight"]["params"] == planned(moonlight)
    assert len(emulated["moonlight"]["params"]) == 27 + 2  # every layer, embedding, output


def test_the_tiny_rank_holds_the_memory_plans_rank_shapes(emulated):
    assert emulated["tiny"]["params"] == planned(moonlight_slice_config(3, **TINY))


def test_each_module_sees_the_tokens_one_rank_of_the_layout_sees(emulated):
    seen = emulated["tiny"]["seen"]
    # attention: all T tokens (sequence-parallel all-gather), this rank's 2 of 16 heads
    assert seen["attention"] and all(a == {"rows": TOKENS, "heads": 16 // TP} for a in seen["attention"])
    # the dense MLP and the shared experts (TP-split): all T tokens, gathered
    assert seen["dense"] and set(seen["dense"]) == {TOKENS}
    assert seen["shared"] and set(seen["shared"]) == {TOKENS}
    # the router: all 64 experts' logits over this rank's T/8 chunk
    assert seen["router"] and all(r["rows"] == TOKENS // TP and r["logits"] == 64 for r in seen["router"])


def test_the_local_experts_receive_t_times_top_k_over_ep_rows(emulated):
    routed, received = emulated["tiny"]["seen"]["router"], emulated["tiny"]["seen"]["experts"]
    assert len(received) == len(routed) >= 8  # 2 MoE layers x (2 logprob + 2 train micro-batches)
    # each rank sends its experts' share of its chunk: 8 ranks' worth arrive here
    assert received == [EP * r["local_picks"] for r in routed]
    # uniform routing: on average T x top_k / EP rows (one draw's std is ~14% of it here)
    mean = sum(received) / len(received)
    assert abs(mean / (TOKENS * TOP_K / EP) - 1) < 0.15, mean


def test_the_emulated_rank_trains(emulated):
    metrics = emulated["tiny"]["metrics"]
    assert metrics["actor/grad_norm"] > 0 and metrics["actor/skipped_steps"] == 0
