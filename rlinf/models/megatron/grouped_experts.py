"""Routed MoE experts as torch grouped GEMMs: a drop-in for megatron-core's `SequentialMLP` in the
TE-free spec (`te_free_block_spec(..., grouped_experts=True)`) and for `TEGroupedMLP` in the TE spec
(`te_block_spec(..., grouped_experts=True)`); `use_grouped_experts` puts them in a block's MoE layers.

Why: without TE, megatron-core builds the routed experts as `SequentialMLP`, a Python loop over the
local experts that leaves a train call host-bound. Here each projection of all local experts is one
`torch.nn.functional.grouped_mm` call (expert offsets from `tokens_per_expert`), as TE's
`TEGroupedMLP` does. With TE, TEGroupedMLP's GroupedLinear runs one cuBLAS GEMM per expert when
TE's fused grouped GEMM is unavailable (it needs cuBLASLt >= 13.4); these experts launch one
`grouped_mm` per projection whatever the cuBLAS. Contract, maths and parameter names (`linear_fc1.weight{i}`,
`linear_fc2.weight{i}`) are megatron's, so Megatron-Bridge converts them and SequentialMLP's
checkpoints load; under DDP the grouped GEMM reads the per-expert weights in place from DDP's buffer
and adds their gradient into its `main_grad` at once (stacked_weights.py). Refused:
ETP > 1, FP8 / FP4, expert biases, latent MoE, interleaved GLU, delayed weight gradients. Off CUDA
the same maths runs as a loop over the experts (`_grouped_mm_runs_on`). docs/megatron.md has the
layout, memory and checks.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F
from megatron.core.fusions.fused_bias_swiglu import weighted_bias_swiglu_impl
from megatron.core.tensor_parallel.random import (
    CheckpointWithoutOutput,
    get_cuda_rng_tracker,
    get_expert_parallel_rng_tracker_name,
)
from megatron.core.transformer.mlp import apply_swiglu_sharded_factory
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.utils import (
    ensure_metadata_has_dp_cp_group,
    make_sharded_tensors_for_checkpoint,
)
from megatron.core.utils import get_pg_rank, get_pg_size

from rlinf.models.megatron.stacked_weights import InPlace, in_place, stacked


def _grouped_mm_runs_on(x: torch.Tensor) -> bool:
    # An EP rank can receive no token at all; the loop handles that without an empty grouped GEMM.
    return x.is_cuda and x.shape[0] > 0


def _unsupported(config, expert_tp_size: int) -> list[str]:
    """What in `config` these experts cannot do (empty when they can run it)."""
    problems = []
    if expert_tp_size > 1:
        problems.append(f"expert tensor parallelism (expert_tensor_parallel_size = {expert_tp_size}; use 1)")
    if config.fp8 or config.fp4:
        problems.append("FP8 / FP4 (needs Transformer Engine)")
    if config.add_bias_linear:
        problems.append("expert biases (add_bias_linear)")
    if config.moe_latent_size is not None:
        problems.append("latent MoE (moe_latent_size)")
    if config.gated_linear_unit and config.moe_mlp_glu_interleave_size is not None:
        problems.append("interleaved GLU weights (moe_mlp_glu_interleave_size)")
    if config.delay_wgrad_compute:
        problems.append("delayed weight-gradient computation (delay_wgrad_compute)")
    return problems


class ExpertLinears(MegatronModule):
    """One projection of every local expert: parameters `weight0..weight{n-1}`, each [out, in].

    `tensor_model_parallel` / `partition_dim` say how the projection would split over expert TP
    (fc1 by output rows, like a column-parallel linear; fc2 by input columns, like a row-parallel
    one): Megatron-Bridge reads them on the module to pick its weight mapping.
    """

    tensor_model_parallel = True
    # Views of the weights (and main grads) in DDP's buffers, set by `view_in_place` once DDP wraps
    # the model; None: the weights are stacked (copied) on every forward.
    in_place: InPlace | None = None

    def __init__(
        self,
        config,
        num_local_experts: int,
        input_size: int,
        output_size: int,
        *,
        partition_dim: int,
        init_method,
        use_expert_pgs: bool,
    ) -> None:
        super().__init__(config=config)
        self.num_local_experts = num_local_experts
        self.partition_dim = partition_dim
        device = _init_device(config)
        weights = [
            torch.nn.Parameter(torch.empty(output_size, input_size, dtype=config.params_dtype, device=device))
            for _ in range(num_local_experts)
        ]
        for weight in weights:  # in expert order: the RNG stream draws them as it did before
            if config.perform_initialization:
                _init_expert_weight(weight, init_method)
        # Registered last to first: DDP lays parameters out in reverse, so that weight0..weight{n-1}
        # then sit in its buffer in expert order, which stacked_weights views in place.
        for i in reversed(range(num_local_experts)):
            weight = weights[i]
            # As megatron's expert linears mark theirs (tensor_parallel/layers.py, TEGroupedLinear).
            weight.allreduce = not use_expert_pgs
            weight.tensor_model_parallel = True
            weight.partition_dim = partition_dim
            weight.partition_stride = 1
            self.register_parameter(f"weight{i}", weight)

    def weights(self) -> list[torch.Tensor]:
        return [getattr(self, f"weight{i}") for i in range(self.num_local_experts)]

    def stacked(self) -> torch.Tensor:
        """The weights as [experts, out, in] (rlinf.models.megatron.stacked_weights)."""
        return stacked(self.weights(), self.in_place)


def _init_device(config) -> torch.device:
    if config.use_cpu_initialization or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _init_expert_weight(weight: torch.nn.Parameter, init_method) -> None:
    if weight.is_cuda:
        # Expert weights differ across EP ranks: megatron draws them from the expert RNG stream.
        with get_cuda_rng_tracker().fork(get_expert_parallel_rng_tracker_name()):
            init_method(weight)
    else:
        init_method(weight)


class GroupedGemmExperts(MegatronModule):
    """All local routed experts of a MoE layer, computed with grouped GEMMs (module docstring)."""

    def __init__(self, num_local_experts: int, config, pg_collection=None, name: str | None = None) -> None:
        super().__init__(config=config)
        self.num_local_experts = num_local_experts
        self.ep_group = pg_collection.ep
        self.tp_group = pg_collection.expt_tp
        self.dp_group = pg_collection.expt_dp
        problems = _unsupported(config, get_pg_size(self.tp_group))
        if problems:
            raise ValueError(
                "rlinf's grouped-GEMM experts (actor.model.moe_grouped_gemm / moe_grouped_gemm_impl) "
                "do not support: " + "; ".join(problems)
            )
        ffn = config.moe_ffn_hidden_size
        # The rule megatron's expert linears use: expert process groups (and buffers) under EP, or
        # when ETP differs from TP.
        use_expert_pgs = (
            config.expert_model_parallel_size > 1
            or config.expert_tensor_parallel_size != config.tensor_model_parallel_size
        )
        self.linear_fc1 = ExpertLinears(
            config,
            num_local_experts,
            config.hidden_size,
            2 * ffn if config.gated_linear_unit else ffn,
            partition_dim=0,
            init_method=config.init_method,
            use_expert_pgs=use_expert_pgs,
        )
        self.linear_fc2 = ExpertLinears(
            config,
            num_local_experts,
            ffn,
            config.hidden_size,
            partition_dim=1,
            init_method=config.output_layer_init_method,
            use_expert_pgs=use_expert_pgs,
        )

    def forward(
        self,
        permuted_local_hidden_states: torch.Tensor,
        tokens_per_expert: torch.Tensor,
        permuted_probs: torch.Tensor,
    ) -> tuple[torch.Tensor, None]:
        hidden = permuted_local_hidden_states
        probs = permuted_probs.unsqueeze(-1)
        if self.config.moe_apply_probs_on_input:
            if self.config.moe_router_topk != 1:
                raise ValueError("moe_apply_probs_on_input needs moe_router_topk = 1 (as in megatron-core)")
            hidden = (probs * hidden).to(hidden.dtype)
            probs = torch.ones_like(probs)
        fc1 = _expert_linear(hidden, self.linear_fc1, tokens_per_expert)
        if not self._recomputes_activation():
            intermediate = self._activation_times_probs(fc1, probs)
            return _expert_linear(intermediate, self.linear_fc2, tokens_per_expert), None
        # As TEGroupedMLP does: fc2 keeps the activation's output for its backward, whose storage is
        # freed after fc2 and refilled by running the activation again when the backward reaches it.
        checkpoint = CheckpointWithoutOutput(fp8=None)  # None: no Transformer Engine FP8 state
        intermediate = checkpoint.checkpoint(self._activation_times_probs, fc1, probs)
        output = _expert_linear(intermediate, self.linear_fc2, tokens_per_expert)
        checkpoint.discard_output_and_register_recompute(output)
        return output, None

    def _recomputes_activation(self) -> bool:
        """Selective recompute of `moe_act`, as megatron-core reads it for TEGroupedMLP."""
        config = self.config
        return config.recompute_granularity == "selective" and "moe_act" in config.recompute_modules

    def _activation_times_probs(self, x: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """The activation, then times each token's routing probability: megatron's MLP without TE."""
        config = self.config
        if config.bias_activation_fusion and config.gated_linear_unit and config.activation_func is F.silu:
            return weighted_bias_swiglu_impl(x, None, probs, config.activation_func_fp8_input_store)
        if config.gated_linear_unit:
            gate, up = torch.chunk(x, 2, dim=-1)
            if (limit := config.activation_func_clamp_value) is not None:
                gate = gate.clamp(min=None, max=limit)
                up = up.clamp(min=-limit, max=limit)
            x = config.activation_func(gate) * (up + config.glu_linear_offset)
        else:
            x = config.activation_func(x)
        return (x * probs).to(x.dtype)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """SequentialMLP's checkpoint keys and layout: expert i of this EP rank is global expert
        `ep_rank * num_local_experts + i` along an extra axis (or its own key with
        `singleton_local_shards`); the gated fc1 is stored as separate gate and up halves."""
        metadata = ensure_metadata_has_dp_cp_group(metadata)
        singleton = metadata.get("singleton_local_shards", False)
        num_global = get_pg_size(self.ep_group) * self.num_local_experts
        first = get_pg_rank(self.ep_group) * self.num_local_experts
        sharded = {}
        for name in ("linear_fc1", "linear_fc2"):
            linear: ExpertLinears = getattr(self, name)
            for i, weight in enumerate(linear.weights()):
                expert = first + i
                if singleton:
                    key_prefix, offsets = f"{prefix}experts.{expert}.{name}.", tuple(sharded_offsets)
                else:
                    key_prefix = f"{prefix}experts.{name}."
                    offsets = (*sharded_offsets, (len(sharded_offsets), expert, num_global))
                tensor = make_sharded_tensors_for_checkpoint(
                    {"weight": weight},
                    key_prefix,
                    {"weight": linear.partition_dim},
                    offsets,
                    tp_group=self.tp_group,
                    dp_cp_group=metadata["dp_cp_group"],
                )[f"{key_prefix}weight"]
                if name == "linear_fc1" and self.config.gated_linear_unit:
                    tensor = apply_swiglu_sharded_factory(
                        tensor, offsets, singleton, tp_group=self.tp_group, dp_group=metadata["dp_cp_group"]
                    )
                # Expert weights are replicated over expert data parallelism only.
                tensor.replica_id = (*tensor.replica_id[:2], get_pg_rank(self.dp_group))
                sharded[f"{prefix}{name}.weight{i}"] = tensor
        return sharded


def _expert_linear(x: torch.Tensor, linear: ExpertLinears, tokens_per_expert: torch.Tensor) -> torch.Tensor:
    """Rows of `x` grouped by expert (`tokens_per_expert[i]` rows for expert i) times expert i's
    weight [out, in] transposed: one grouped GEMM on CUDA, a loop elsewhere."""
    if _grouped_mm_runs_on(x):
        offsets = torch.cumsum(tokens_per_expert, 0, dtype=torch.int32).to(x.device, non_blocking=True)
        return F.grouped_mm(x, linear.stacked().transpose(1, 2), offs=offsets)
    rows = x.split(tokens_per_expert.tolist())
    weights = linear.stacked().unbind(0)
    return torch.cat([F.linear(part, weight) for part, weight in zip(rows, weights, strict=True)])


def view_in_place(model: torch.nn.Module, ddp_config) -> int:
    """Lets the grouped experts of a DDP-wrapped `model` read their weights in place from DDP's
    buffer and, where DDP reduces gradients only after the backward (`overlap_grad_reduce` off), add
    their stacked weight gradients into its `main_grad` buffer themselves. Returns how many expert
    projections add into `main_grad`."""
    linears = [m for m in model.modules() if isinstance(m, ExpertLinears)]
    for linear in linears:
        linear.in_place = in_place(linear.weights(), grad_into_main_grad=not ddp_config.overlap_grad_reduce)
    return sum(linear.in_place is not None and linear.in_place.main_grad is not None for linear in linears)


def use_grouped_experts(layer_specs: list, spec: str) -> int:
    """Gives every MoE layer of `layer_specs` (megatron-core TransformerLayer specs, already copied)
    GroupedGemmExperts as its routed experts; dense layers and the shared experts stay as they are.
    Returns how many layers changed; `spec` names the block spec in the error when none did."""
    changed = 0
    for layer_spec in layer_specs:
        if (moe := _with_grouped_experts(layer_spec.submodules.mlp)) is not None:
            layer_spec.submodules.mlp = moe
            changed += 1
    if not changed:
        raise ValueError(f"{spec}: no MoE layer found to give grouped-GEMM experts")
    return changed


def _with_grouped_experts(mlp):
    """megatron-core's MoE layer builder, `partial(MoELayer, submodules=...)`, with the routed
    experts replaced by GroupedGemmExperts; None for any other MLP builder (a dense layer's)."""
    if not (isinstance(mlp, functools.partial) and mlp.func is MoELayer):
        return None
    submodules = dataclasses.replace(mlp.keywords["submodules"], experts=GroupedGemmExperts)
    return functools.partial(MoELayer, *mlp.args, **{**mlp.keywords, "submodules": submodules})
