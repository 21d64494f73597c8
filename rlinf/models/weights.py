"""Move a model's weights as named tensors, in size-bounded buckets (weight sync, export, tests).

Names are those of a HF checkpoint on disk, i.e. what `save_pretrained` writes and what SGLang and
Megatron-Bridge read. transformers 5 keeps a MoE layer's routed experts fused in memory
(`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]) but saves one tensor per
expert (`mlp.experts.{e}.gate_proj.weight` ...); the fused tensors are split here as views, without
copies, and written back into the fused parameters by `load_weight_bucket`.

Persistent buffers travel too: the routers' `e_score_correction_bias` is a buffer, not a parameter,
and the routing depends on it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

NamedTensors = Iterable[tuple[str, torch.Tensor]]
WeightSource = nn.Module | NamedTensors
WeightBucket = list[tuple[str, torch.Tensor]]

_FUSED_EXPERTS = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<kind>gate_up_proj|down_proj)$")
_EXPERT_WEIGHT = re.compile(
    r"^(?P<prefix>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$"
)


class WeightLoadError(ValueError):
    """A named tensor cannot be loaded into a model; the message names the tensor."""


def checkpoint_tensors(source: WeightSource) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) under checkpoint names: a module's state_dict, or named tensors as given.

    Already per-expert names pass through unchanged, so a source that speaks checkpoint names
    (Megatron-Bridge export, a safetensors file) is accepted as well.
    """
    named = source.state_dict().items() if isinstance(source, nn.Module) else source
    for name, tensor in named:
        fused = _FUSED_EXPERTS.match(name)
        if fused is None:
            yield name, tensor
        elif fused["kind"] == "down_proj":
            for expert, weight in enumerate(tensor):
                yield f"{fused['prefix']}.{expert}.down_proj.weight", weight
        else:
            for expert, weight in enumerate(tensor):
                gate, up = weight.chunk(2, dim=0)
                yield f"{fused['prefix']}.{expert}.gate_proj.weight", gate
                yield f"{fused['prefix']}.{expert}.up_proj.weight", up


def iter_weight_buckets(source: WeightSource, bucket_bytes: int) -> Iterator[WeightBucket]:
    """Consecutive buckets of checkpoint-named tensors, each at most `bucket_bytes` in total.

    A tensor larger than the bound travels alone in its own bucket. Tensors are views of the
    source's storage: copy them before the source changes if they must outlive that.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    bucket: WeightBucket = []
    size = 0
    for name, tensor in checkpoint_tensors(source):
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


@torch.no_grad()
def load_weight_bucket(model: nn.Module, bucket: NamedTensors, *, strict_names: bool = True) -> None:
    """Copy checkpoint-named tensors into `model`'s parameters and buffers in place.

    Values are cast to the destination's dtype and moved to its device. A shape mismatch is always
    an error; a name the model does not have is an error unless `strict_names` is False, when it
    is skipped (e.g. MTP layers of a checkpoint).
    """
    targets = model.state_dict(keep_vars=True)
    for name, tensor in bucket:
        destination = _destination(targets, name)
        if destination is None:
            if strict_names:
                raise WeightLoadError(f"weight {name} has no counterpart in {type(model).__name__}")
            continue
        if destination.shape != tensor.shape:
            raise WeightLoadError(
                f"weight {name} has shape {tuple(tensor.shape)} but the model's is {tuple(destination.shape)}"
            )
        destination.copy_(tensor)


def weights_equal(a: WeightSource, b: WeightSource) -> bool:
    """Whether `b` holds exactly what loading `a` into it gives: same names and shapes, and every
    tensor of `b` equal to `a`'s cast to `b`'s dtype (an fp32 actor and a bf16 rollout compare
    equal when the rollout holds the bf16 rounding of the actor's weights)."""
    tensors_a, tensors_b = dict(checkpoint_tensors(a)), dict(checkpoint_tensors(b))
    if tensors_a.keys() != tensors_b.keys():
        return False
    for name, tb in tensors_b.items():
        ta = tensors_a[name]
        if ta.shape != tb.shape or not torch.equal(ta.to(device=tb.device, dtype=tb.dtype), tb):
            return False
    return True


def max_weight_diff(a: WeightSource, b: WeightSource) -> float:
    """Largest absolute elementwise difference over all weights, computed in fp32."""
    tensors_a, tensors_b = dict(checkpoint_tensors(a)), dict(checkpoint_tensors(b))
    if tensors_a.keys() != tensors_b.keys():
        only_a = sorted(tensors_a.keys() - tensors_b.keys())[:5]
        only_b = sorted(tensors_b.keys() - tensors_a.keys())[:5]
        raise ValueError(f"the two models' weights differ in names: only in a: {only_a}; only in b: {only_b}")
    largest = 0.0
    for name, ta in tensors_a.items():
        tb = tensors_b[name]
        if ta.shape != tb.shape:
            raise ValueError(f"weight {name} has shape {tuple(ta.shape)} in a but {tuple(tb.shape)} in b")
        if ta.numel():
            diff = (ta.float() - tb.to(ta.device).float()).abs().max()
            largest = max(largest, float(diff))
    return largest


def _destination(targets: dict[str, torch.Tensor], name: str) -> torch.Tensor | None:
    if name in targets:
        return targets[name]
    expert_weight = _EXPERT_WEIGHT.match(name)
    if expert_weight is None:
        return None
    prefix, expert, proj = expert_weight["prefix"], int(expert_weight["expert"]), expert_weight["proj"]
    fused = targets.get(f"{prefix}.{'down_proj' if proj == 'down_proj' else 'gate_up_proj'}")
    if fused is None or expert >= fused.shape[0]:
        return None
    if proj == "down_proj":
        return fused[expert]
    gate, up = fused[expert].chunk(2, dim=0)
    return gate if proj == "gate_proj" else up
