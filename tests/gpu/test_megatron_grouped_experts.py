"""The Megatron actor with rlinf's grouped-GEMM routed experts (`actor.model.moe_grouped_gemm: true`,
`moe_grouped_gemm_impl: torch`; rlinf.models.megatron.grouped_experts) on one GPU, in the spec the
machine runs (TE's in place of TEGroupedMLP, or the TE-free one): the checks of test_megatron_actor.py
that the experts change, run on torch's CUDA grouped_mm.

- logprobs equal the HF model's (GPU-tiny fp32 / bf16, Moonlight slice bf16), same bars;
- exported HF weights equal the checkpoint's tensors bit for bit (GPU-tiny, Moonlight slice);
- one GRPO minibatch gives the torch actor's loss and grad norm (fp32; fp32 grouped_mm is torch's
  per-group fallback, bf16 its grouped kernel).

Run: bash tests/gpu/run_megatron_checks.sh experts (in the spec this machine runs), or `grouped`
(TE-free: also benchmarks the slice with the key on); `te-experts` benchmarks them under TE.
"""

from __future__ import annotations

import pytest
from test_megatron_actor import (
    compare_logprobs,
    export_equals_checkpoint,
    one_minibatch_matches_the_torch_actor,
)

CASES = [("gpu_tiny", "fp32"), ("gpu_tiny", "bf16"), ("moonlight_slice", "bf16")]


@pytest.mark.parametrize(("which", "precision"), CASES)
def test_grouped_experts_logprobs_match_hf(megatron_installed, request, which, precision):
    name = f"megatron (grouped GEMM experts) vs HF logprobs, {which}"
    compare_logprobs(request.getfixturevalue(which), precision, name, grouped_gemm=True)


@pytest.mark.parametrize("which", ["gpu_tiny", "moonlight_slice"])
def test_grouped_experts_export_the_checkpoint_bit_for_bit(megatron_installed, request, which):
    export_equals_checkpoint(request.getfixturevalue(which), which, grouped_gemm=True)


def test_grouped_experts_minibatch_matches_the_torch_actor(megatron_installed, gpu_tiny):
    one_minibatch_matches_the_torch_actor(gpu_tiny, grouped_gemm=True)
