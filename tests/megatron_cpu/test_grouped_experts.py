"""rlinf's grouped-GEMM routed experts (rlinf.models.megatron.grouped_experts) against megatron-core's
SequentialMLP, on the CPU in fp32:

- the module alone, same weights and permuted tokens (one expert gets none): outputs, weight grads,
  input and routing-probability grads equal; both on the CPU loop and on torch's grouped_mm (which
  torch 2.11 also runs on the CPU), for fused and unfused SwiGLU and for probs applied on the input;
  an EP rank that receives no token at all;
- the same parallel attributes on every parameter (what megatron's DDP and optimizer read) and the
  same distributed-checkpoint layout as SequentialMLP (a SequentialMLP checkpoint loads); expert
  tensor parallelism refused;
- a whole tiny MLA + MoE GPTModel built by Megatron-Bridge from one HF checkpoint with the
  TE-free spec, `actor.model.moe_grouped_gemm` on vs off: the same logits (and the HF model's), the
  same grads, and the bridge's export gives the checkpoint's HF-named tensors back.
"""

from __future__ import annotations

import importlib.util
import re
import types

import pytest
import torch
import torch.nn.functional as F

REASON = "needs megatron-core 0.19 and megatron-bridge 0.6 (bash requirements/install.sh agentic ...)"
pytest.importorskip("megatron.core", reason=REASON)
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip(REASON, allow_module_level=True)

from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: E402
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from megatron.core.transformer.mlp import MLPSubmodules  # noqa: E402
from megatron.core.transformer.moe.experts import SequentialMLP  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from rlinf.models.megatron import grouped_experts  # noqa: E402
from rlinf.models.megatron.grouped_experts import GroupedGemmExperts  # noqa: E402

HIDDEN, FFN, EXPERTS = 32, 16, 4
TOKENS_PER_EXPERT = [3, 0, 5, 2]  # expert 1 gets no token

CONFIGS = {
    "fused swiglu": {},
    "unfused swiglu": {"bias_activation_fusion": False},
    "probs on input (top-1)": {
        "moe_router_topk": 1,
        "moe_router_pre_softmax": True,
        "moe_apply_probs_on_input": True,
    },
}


def expert_config(**overrides) -> TransformerConfig:
    fields = dict(
        num_layers=1,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        ffn_hidden_size=FFN,
        moe_ffn_hidden_size=FFN,
        num_moe_experts=EXPERTS,
        moe_router_topk=2,
        gated_linear_unit=True,
        activation_func=F.silu,
        bias_activation_fusion=True,
        add_bias_linear=False,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
    )
    return TransformerConfig(**(fields | overrides))


def sequential_mlp(config, pg_collection) -> SequentialMLP:
    submodules = MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
    return SequentialMLP(EXPERTS, config, submodules=submodules, pg_collection=pg_collection)


def grouped_copy_of(reference: SequentialMLP, config, pg_collection) -> GroupedGemmExperts:
    grouped = GroupedGemmExperts(EXPERTS, config, pg_collection=pg_collection)
    with torch.no_grad():
        for i, expert in enumerate(reference.local_experts):
            getattr(grouped.linear_fc1, f"weight{i}").copy_(expert.linear_fc1.weight)
            getattr(grouped.linear_fc2, f"weight{i}").copy_(expert.linear_fc2.weight)
    return grouped


def run_experts(experts, hidden, probs, grad_out):
    hidden = hidden.clone().requires_grad_()
    probs = probs.clone().requires_grad_()
    out, bias = experts(hidden, torch.tensor(TOKENS_PER_EXPERT), probs)
    assert bias is None
    out.backward(grad_out)
    return out.detach(), hidden.grad, probs.grad


@pytest.fixture(params=["loop", "grouped_mm"])
def expert_path(request, monkeypatch):
    """`loop`: the CPU path. `grouped_mm`: the CUDA path's grouped GEMM, run by torch on the CPU."""
    if request.param == "grouped_mm":
        monkeypatch.setattr(grouped_experts, "_grouped_mm_runs_on", lambda x: True)
    return request.param


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_experts_equal_sequential_mlp_forward_and_backward(model_parallel, expert_path, overrides):
    torch.manual_seed(0)
    config = expert_config(**overrides)
    groups = ProcessGroupCollection.use_mpu_process_groups()
    reference = sequential_mlp(config, groups)
    grouped = grouped_copy_of(reference, config, groups)
    tokens = sum(TOKENS_PER_EXPERT)
    hidden, probs = torch.randn(tokens, HIDDEN), torch.rand(tokens)
    grad_out = torch.randn(tokens, HIDDEN)  # a loss that weights every output element differently

    want = run_experts(reference, hidden, probs, grad_out)
    got = run_experts(grouped, hidden, probs, grad_out)

    for name, w, g in zip(("output", "input grad", "probs grad"), want, got, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6, msg=name)
    for i, expert in enumerate(reference.local_experts):
        for fc in ("linear_fc1", "linear_fc2"):
            want_grad = getattr(expert, fc).weight.grad
            got_grad = getattr(getattr(grouped, fc), f"weight{i}").grad
            torch.testing.assert_close(got_grad, want_grad, atol=1e-6, rtol=1e-6, msg=f"expert {i} {fc}")
    assert not grouped.linear_fc1.weight1.grad.any()  # the expert without tokens


def test_a_rank_without_tokens_gets_an_empty_output_and_zero_grads(model_parallel):
    groups = ProcessGroupCollection.use_mpu_process_groups()
    grouped = GroupedGemmExperts(EXPERTS, expert_config(), pg_collection=groups)
    hidden = torch.zeros(0, HIDDEN, requires_grad=True)
    out, _ = grouped(hidden, torch.zeros(EXPERTS, dtype=torch.long), torch.zeros(0))
    out.sum().backward()
    assert out.shape == (0, HIDDEN)
    assert all(p.grad is not None and not p.grad.any() for p in grouped.parameters())


@pytest.mark.parametrize("expert_parallel", [1, 2])
def test_parameters_carry_sequential_mlp_parallel_attributes(model_parallel, expert_parallel):
    """`allreduce` False puts expert params in DDP's expert-parallel buffers; the TP attributes
    decide grad-norm and checkpoint handling. (EP = 2 only in the config: the groups stay size 1.)"""
    config = expert_config(expert_model_parallel_size=expert_parallel)
    groups = ProcessGroupCollection.use_mpu_process_groups()
    reference, grouped = (
        sequential_mlp(config, groups),
        GroupedGemmExperts(EXPERTS, config, pg_collection=groups),
    )
    attributes = ("allreduce", "tensor_model_parallel", "partition_dim", "partition_stride")
    for i, expert in enumerate(reference.local_experts):
        for fc in ("linear_fc1", "linear_fc2"):
            want, got = getattr(expert, fc).weight, getattr(getattr(grouped, fc), f"weight{i}")
            assert got.shape == want.shape
            # MLP marks a gated fc1 with stride 2 (interleaved gate/up shards under TP); grouped
            # experts have no expert TP, as TEGroupedMLP marks its weights: stride 1.
            expected = {a: getattr(want, a) for a in attributes} | {"partition_stride": 1}
            assert {a: getattr(got, a) for a in attributes} == expected, (i, fc)
    assert all(not p.allreduce for p in grouped.parameters()) == (expert_parallel > 1)


class FakeGroup:
    """An expert-parallel group seen from one rank: only rank() and size() are asked."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def _layout(sharded) -> dict:
    """What a distributed checkpoint records for one weight (a gated fc1 is saved as two halves)."""
    tensors = sharded.build() if hasattr(sharded, "build") else sharded
    tensors = tensors if isinstance(tensors, list) else [tensors]
    return [
        (t.key, t.global_shape, t.global_offset, t.axis_fragmentations, t.replica_id, t.data.tolist())
        for t in tensors
    ]


@pytest.mark.parametrize("singleton_local_shards", [False, True])
def test_checkpoint_layout_is_sequential_mlp_s(model_parallel, singleton_local_shards):
    """Rank 1 of an EP group of 2: every weight goes to the same checkpoint key, offset and replica."""
    torch.manual_seed(0)
    config = expert_config()
    real = ProcessGroupCollection.use_mpu_process_groups()
    groups = types.SimpleNamespace(ep=FakeGroup(1, 2), expt_tp=real.expt_tp, expt_dp=real.expt_dp)
    reference = sequential_mlp(config, groups)
    grouped = grouped_copy_of(reference, config, groups)
    metadata = {"singleton_local_shards": singleton_local_shards}
    prefix = "decoder.layers.1.mlp.experts."
    want = reference.sharded_state_dict(prefix, metadata=dict(metadata))
    got = grouped.sharded_state_dict(prefix, metadata=dict(metadata))

    # SequentialMLP's linears also save an empty `_extra_state` (None); grouped experts have none.
    want = {k: v for k, v in want.items() if not k.endswith("_extra_state")}
    assert len(got) == len(want) == 2 * EXPERTS
    for i in range(EXPERTS):
        for fc in ("linear_fc1", "linear_fc2"):
            expect = _layout(want[f"{prefix}local_experts.{i}.{fc}.weight"])
            assert _layout(got[f"{prefix}{fc}.weight{i}"]) == expect, (i, fc)
    first = got[f"{prefix}linear_fc2.weight0"]  # EP rank 1's expert 0 is global expert 4
    if singleton_local_shards:
        assert first.key == f"{prefix}experts.{EXPERTS}.linear_fc2.weight"
    else:
        assert first.key == f"{prefix}experts.linear_fc2.weight" and first.global_offset[0] == EXPERTS


def test_a_sequential_mlp_checkpoint_loads_into_grouped_experts(
    model_parallel, cuda_device_is_cpu, tmp_path, monkeypatch
):
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    # The writer logs its memory through psutil, and raises without it (as the actor works around).
    monkeypatch.setattr(filesystem_async, "_process_memory", lambda: 0)

    torch.manual_seed(0)
    config = expert_config()
    groups = ProcessGroupCollection.use_mpu_process_groups()
    reference = sequential_mlp(config, groups)
    dist_checkpointing.save(reference.sharded_state_dict("experts."), str(tmp_path))
    torch.manual_seed(1)
    grouped = GroupedGemmExperts(EXPERTS, config, pg_collection=groups)
    loaded = dist_checkpointing.load(grouped.sharded_state_dict("experts."), str(tmp_path))
    grouped.load_state_dict({k.removeprefix("experts."): v for k, v in loaded.items()})
    for i, expert in enumerate(reference.local_experts):
        assert torch.equal(grouped.linear_fc1.get_parameter(f"weight{i}"), expert.linear_fc1.weight)
        assert torch.equal(grouped.linear_fc2.get_parameter(f"weight{i}"), expert.linear_fc2.weight)


# --- a whole model through Megatron-Bridge ---------------------------------------------------------

VOCAB = 64


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    """A random fp32 tiny DeepSeek-V3 (layer 0 dense, layers 1-2 MoE with 8 experts, top-2)."""
    from rlinf.models.tiny import TinyModelSettings, random_deepseek_v3

    out = tmp_path_factory.mktemp("tiny-deepseek-v3")
    random_deepseek_v3(TinyModelSettings(num_hidden_layers=3), vocab_size=VOCAB).save_pretrained(out)
    return out


def bridge_model(path, *, grouped_gemm: bool):
    """(bridge, GPTModel on the CPU with the checkpoint's weights), the actor's TE-free settings."""
    from rlinf.config.megatron_settings import translate
    from rlinf.config.schema import ActorConfig, ModelConfig
    from rlinf.models.megatron.bridge import provider_for

    # The alltoall dispatcher makes CUDA streams; allgather hands the experts the same contract.
    model = ModelConfig(
        precision="fp32", moe_token_dispatcher_type="allgather", moe_grouped_gemm=grouped_gemm
    )
    settings = translate(ActorConfig(seq_length=64, model=model), te_available=False)
    assert settings.grouped_experts == grouped_gemm
    bridge, provider = provider_for(str(path), settings, te_available=False)
    (gpt,) = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
    return bridge, gpt


def _sequential_name(name: str) -> str:
    """A grouped-experts parameter name as SequentialMLP spells it."""
    return re.sub(r"experts\.(linear_fc\d)\.weight(\d+)$", r"experts.local_experts.\2.\1.weight", name)


def test_whole_model_with_grouped_experts_equals_sequential_mlp_and_exports_the_checkpoint(
    model_parallel, cuda_device_is_cpu, hf_checkpoint, expert_path
):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    tokens = torch.randint(0, VOCAB, (2, 24))
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    grad_logits = torch.randn(*tokens.shape, VOCAB)
    results = {}
    for grouped_gemm in (False, True):
        bridge, model = bridge_model(hf_checkpoint, grouped_gemm=grouped_gemm)
        experts = [m for m in model.modules() if isinstance(m, (GroupedGemmExperts, SequentialMLP))]
        assert len(experts) == 2 and all(isinstance(m, GroupedGemmExperts) == grouped_gemm for m in experts)
        logits = model(input_ids=tokens, position_ids=positions, attention_mask=None)
        logits.backward(grad_logits)
        grads = {_sequential_name(n): p.grad for n, p in model.named_parameters()}
        exported = dict(bridge.export_hf_weights([model], cpu=True, show_progress=False))
        results[grouped_gemm] = (logits.detach(), grads, exported)

    (want_logits, want_grads, want_export), (got_logits, got_grads, got_export) = (
        results[False],
        results[True],
    )
    torch.testing.assert_close(got_logits, want_logits, atol=1e-5, rtol=1e-5)
    assert got_grads.keys() == want_grads.keys()
    for name, grad in want_grads.items():
        # fp32 rounding relative to the tensor's scale: torch.compile'd SwiGLU (megatron's fused
        # kernel) and its eager fallback differ in the last bits, e.g. 2e-5 on embedding grads of 73.
        scale = grad.abs().max().item()
        assert (got_grads[name] - grad).abs().max().item() <= 2e-6 * scale + 1e-7, name

    checkpoint = load_file(hf_checkpoint / "model.safetensors")
    assert got_export.keys() == want_export.keys() == checkpoint.keys()
    assert any(".mlp.experts.7.gate_proj." in name for name in checkpoint)
    for name, tensor in checkpoint.items():
        assert torch.equal(got_export[name], tensor), name

    hf = AutoModelForCausalLM.from_pretrained(hf_checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(got_logits, hf(tokens).logits, atol=1e-4, rtol=1e-4)


def test_grouped_experts_refuse_expert_tensor_parallelism(model_parallel):
    real = ProcessGroupCollection.use_mpu_process_groups()
    groups = types.SimpleNamespace(ep=real.ep, expt_tp=FakeGroup(0, 2), expt_dp=real.expt_dp)
    with pytest.raises(ValueError, match="expert tensor parallelism"):
        GroupedGemmExperts(EXPERTS, expert_config(), pg_collection=groups)


def test_selective_recompute_of_moe_act_runs_the_activation_again_with_the_same_results(
    model_parallel, expert_path, on_cpu
):
    """`moe_act` in the recompute modules (the Moonlight recipe's): fc2 keeps no copy of the
    activation's output; the backward runs the activation again, and outputs and grads are those
    of the run that kept it."""
    torch.manual_seed(0)
    groups = ProcessGroupCollection.use_mpu_process_groups()
    kept = GroupedGemmExperts(EXPERTS, expert_config(), pg_collection=groups)
    recompute = expert_config(
        moe_grouped_gemm=True, recompute_granularity="selective", recompute_modules=["moe_act"]
    )
    recomputed = GroupedGemmExperts(EXPERTS, recompute, pg_collection=groups)
    recomputed.load_state_dict(kept.state_dict())
    calls = []
    activation = GroupedGemmExperts._activation_times_probs

    def counted(self, x, probs):
        calls.append(self)
        return activation(self, x, probs)

    GroupedGemmExperts._activation_times_probs = counted
    try:
        tokens = sum(TOKENS_PER_EXPERT)
        hidden, probs, grad_out = torch.randn(tokens, HIDDEN), torch.rand(tokens), torch.randn(tokens, HIDDEN)
        want = run_experts(kept, hidden, probs, grad_out)
        got = run_experts(recomputed, hidden, probs, grad_out)
    finally:
        GroupedGemmExperts._activation_times_probs = activation
    assert [c is recomputed for c in calls] == [False, True, True]
    for name, w, g in zip(("output", "input grad", "probs grad"), want, got, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6, msg=name)
    for (name, w), g in zip(kept.named_parameters(), recomputed.parameters(), strict=True):
        torch.testing.assert_close(g.grad, w.grad, atol=1e-6, rtol=1e-6, msg=name)
