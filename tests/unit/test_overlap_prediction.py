"""benchmarks/step_time_model.py and overlap_prediction.py: the step-time rules on hand-checked
numbers, the decode cost and memory of the Moonlight recipe's placements, and the command."""

import json
from pathlib import Path

import pytest

from benchmarks.overlap_prediction import RECIPE, main, split
from benchmarks.step_time_model import Phases, fits, layout, predict, predict_layout, with_rollout_share
from rlinf.config import load_config
from rlinf.models.memory_plan import GPU_BYTES, rank_params

ROOT = Path(__file__).parents[2]
MOONLIGHT = ROOT / "tests" / "fixtures" / "moonlight-16b-a3b-config.json"
H200 = GPU_BYTES["H200"]
REF = Phases(
    rollout=4.0, reward=0.5, logprobs=1.0, train=3.0, weight_sync=0.5, offload_onload=1.0, other=0.25
)


@pytest.fixture(scope="module")
def moonlight() -> dict:
    return json.loads(MOONLIGHT.read_text())


def test_bound_0_adds_the_two_sides_and_bound_1_overlaps_them():
    assert REF.step == 10.25
    assert predict(REF, 1.0, 1.0, 1.0, offload=True, bound=0).step == 10.25  # the reference itself
    assert predict(REF, 1.0, 1.0, 1.0, offload=False, bound=0).step == 9.25  # resident: no offload
    # 4 + 4: the actor on half the GPUs (x 2), the sync over NCCL (x 2), nothing offloaded
    serial = predict(REF, 1.0, 2.0, 2.0, offload=False, bound=0)
    assert (serial.rollout_side, serial.actor_side, serial.serial, serial.step) == (4.5, 8.0, 1.25, 13.75)
    assert predict(REF, 1.0, 2.0, 2.0, offload=False, bound=1).step == 9.25  # max(4.5, 8) + 1.25
    assert predict(REF, 3.0, 2.0, 2.0, offload=False, bound=1).step == 13.75  # max(12.5, 8) + 1.25


def test_stretching_the_rollout_keeps_the_other_phases():
    stretched = with_rollout_share(REF, 0.8)
    assert stretched.rollout == pytest.approx(25.0)  # 0.8 x the other 6.25 s / 0.2
    assert stretched.rollout / stretched.step == pytest.approx(0.8)
    assert (stretched.train, stretched.offload_onload) == (REF.train, REF.offload_onload)


def test_decode_cost_and_memory_of_the_placements(moonlight):
    ref = layout(load_config(RECIPE, ["actor.offload_between_phases=true"]), moonlight, H200)
    # SGLang's 0.5 x 140.4 GiB less 4.05 GB of weights (2 B x 2.03 B parameters at TP = EP = 8),
    # over a full-length response's latent KV (9216 tokens x 27 layers x 576 x 2 B): 248 of the 512
    assert (ref.engines, ref.running_batch, ref.colocated, ref.offload) == (1, 248, True, True)
    assert ref.peak_rollout == pytest.approx(0.5 * H200)  # the actor is offloaded while SGLang runs
    four = layout(
        load_config(RECIPE, [*split(4, actor_tp=4, rollout_tp=2), "runner.max_staleness=1"]), moonlight, H200
    )
    assert (four.engines, four.running_batch, four.actor_gpus, four.bound) == (2, 256, 4, 1)
    # a token costs 4.05 GB / 248 + 2560 tokens of context x 31104 B = 95.9 MB on 512 responses;
    # at TP = 2, 16.0 GB / 256 + 79.6 MB = 142.1 MB on 256 responses an engine: 0.741
    assert four.decode_cost / ref.decode_cost == pytest.approx(0.740, abs=0.002)
    # the actor at TP = EP = 4, DP = 1: 14 B a parameter, plus one micro-batch's activations
    assert four.peak_actor > 14 * rank_params(moonlight, tp=4, ep=4).total
    assert four.peak_rollout == pytest.approx(0.85 * H200) and fits(four, H200)
    shared = layout(
        load_config(RECIPE, ["actor.offload_between_phases=false", "runner.max_staleness=1"]), moonlight, H200
    )
    with pytest.raises(ValueError, match="not predicted: with a bound, colocated roles run at once"):
        predict_layout(REF, ref, shared, nccl_sync_factor=2.0)
    one = layout(load_config(RECIPE, split(7, actor_tp=1, rollout_tp=1)), moonlight, H200)
    assert one.peak_actor > 14 * 15.9e9 and not fits(one, H200)  # the whole actor on one GPU


def test_the_command_prints_the_tables_and_refuses_bad_input(capsys, tmp_path):
    assert main(["--hf-config", str(MOONLIGHT)]) == 0
    out = capsys.readouterr().out
    assert "measured step 11.85 s: rollout 3.689, reward 0.016, logprobs 1.514" in out
    assert "| 1 | 8 colocated, offloaded (reference) | 0 | 8: 1 x TP=8 (batch 248) | 8: 8 / 8 / 1 | " in out
    assert "| 3.71 | 6.37 | 1.77 | 11.85 | 1.00x | 70.2 (50%) |" in out  # the measured step, back
    assert "#8 2 rollout + 6 actor, bound 1: refused by the recipe's checks: actor.global_batch_size" in out
    assert out.strip() in (ROOT / "docs" / "moonlight.md").read_text()  # the doc shows today's output
    assert main(["--hf-config", str(MOONLIGHT), "--phase", "rollout=fast"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "overlap_prediction: --phase rollout=fast: 'fast' is not a number of seconds"
    )
    empty = tmp_path / "rows.jsonl"
    empty.write_text('{"step": 1}\n')
    assert main(["--hf-config", str(MOONLIGHT), "--measured", str(empty)]) == 2
    assert "no row with phase_seconds" in capsys.readouterr().err
