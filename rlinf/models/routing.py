"""MoE routing of the HF DeepSeek-V3 model: which experts each token takes, recorded and replayed.

Every MoE layer's gate (transformers' `DeepseekV3TopkRouter`) returns (router_logits, topk_weights,
topk_indices) for the tokens of one forward, flattened row-major over [batch, tokens]. Forward hooks
on the gates:

- `ExpertRecorder` keeps each layer's `topk_indices` (the torch rollout records what it sampled with);
- `ExpertReplay` swaps the gate's choice for given indices and recomputes their weights from the FULL
  router logits with the router's own scoring: sigmoid, gathered at the replayed experts, normalised
  over them (norm_topk_prob) and times routed_scaling_factor. The weights stay a function of the
  router weight rows of the replayed experts, so gradients reach them, also for an expert the
  router's own top-k would not have picked (gathering from the post-top-k probabilities, zero off
  the router's own choice, would cut that gradient). It also counts how often the router's own top-k
  set equals the replayed one (routing agreement), before forcing it.

Expert ids travel as uint8 (`EXPERT_ID_DTYPE`), so at most 256 routed experts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from rlinf.config.typed import ConfigError

EXPERT_ID_DTYPE = torch.uint8
MAX_EXPERTS = 256


@dataclass(frozen=True)
class RoutingShape:
    num_moe_layers: int
    top_k: int
    num_experts: int


class RoutingReplayError(ConfigError):
    """A model whose routing cannot be recorded or replayed (dense, too many experts): bad input."""


def routing_shape(config: Any) -> RoutingShape:
    """The routed-expert shape of a DeepSeek-V3 config; raises RoutingReplayError for a dense model
    or one with more experts than uint8 ids can name."""
    layers = int(config.num_hidden_layers) - int(getattr(config, "first_k_dense_replace", 0) or 0)
    experts = int(getattr(config, "n_routed_experts", 0) or 0)
    if layers <= 0 or experts <= 0:
        raise RoutingReplayError(
            "algorithm.routing_replay.mode: the model is dense (n_routed_experts "
            f"{experts}, first_k_dense_replace {getattr(config, 'first_k_dense_replace', None)} of "
            f"{config.num_hidden_layers} layers): it has no routed experts to record or replay; set mode: none"
        )
    if experts > MAX_EXPERTS:
        raise RoutingReplayError(
            f"algorithm.routing_replay.mode: the model has {experts} routed experts; recorded expert ids "
            f"are uint8, so at most {MAX_EXPERTS}; set mode: none"
        )
    return RoutingShape(layers, int(config.num_experts_per_tok), experts)


def check_replayable(actor_config: Any, rollout_config: Any) -> RoutingShape:
    """The actor's and the rollout's models both have routed experts, and the same routing shape
    (what the rollout records is what the actor replays)."""
    actor, rollout = routing_shape(actor_config), routing_shape(rollout_config)
    if actor != rollout:
        raise RoutingReplayError(
            f"algorithm.routing_replay.mode: the rollout model routes {rollout} but the actor model "
            f"{actor}; recorded experts can only be replayed into the same architecture"
        )
    return actor


def moe_gates(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The gate (router) of every MoE layer, in layer order."""
    inner = getattr(model, "module", model)  # DDP
    body = getattr(inner, "model", inner)
    gates = [layer.mlp.gate for layer in body.layers if hasattr(layer.mlp, "gate")]
    if not gates:
        raise RoutingReplayError("algorithm.routing_replay.mode: the model has no MoE layer (no router gate)")
    return gates


@contextmanager
def _hooks(gates: list[torch.nn.Module], make_hook) -> Iterator[None]:
    handles = [gate.register_forward_hook(make_hook(layer)) for layer, gate in enumerate(gates)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class ExpertRecorder:
    """Within `recording()`, every forward's chosen experts; `take()` returns the last forward's."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.gates = moe_gates(model)
        self._layers: list[torch.Tensor | None] = [None] * len(self.gates)
        self.seconds = 0.0  # spent collecting records (hooks and take), since the last pop_seconds

    def pop_seconds(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    @contextmanager
    def recording(self) -> Iterator[ExpertRecorder]:
        def make_hook(layer: int):
            def hook(_module, _args, output):
                started = time.perf_counter()
                self._layers[layer] = output[2].detach()
                self.seconds += time.perf_counter() - started

            return hook

        with _hooks(self.gates, make_hook):
            yield self

    def take(self) -> torch.Tensor:
        """[tokens of the last forward (row-major), MoE layers, top_k] uint8; clears the record."""
        if any(t is None for t in self._layers):
            raise RuntimeError("ExpertRecorder.take: no forward ran through every MoE layer")
        started = time.perf_counter()
        out = torch.stack(self._layers, dim=1).to(EXPERT_ID_DTYPE)  # type: ignore[arg-type]
        self._layers = [None] * len(self.gates)
        self.seconds += time.perf_counter() - started
        return out


def replayed_weights(
    router: torch.nn.Module, router_logits: torch.Tensor, indices: torch.Tensor
) -> torch.Tensor:
    """The gate's top-k weights had it chosen `indices` [N, k]: the router's scoring (sigmoid) of the
    full logits [N, E], gathered there, normalised like the router, times its scaling factor."""
    weights = router_logits.sigmoid().gather(1, indices)
    if router.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * router.routed_scaling_factor


def same_expert_sets(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[N] bool: row i of `a` and of `b` [N, k] name the same set of experts (in any order)."""
    return (a.long().sort(-1).values == b.long().sort(-1).values).all(-1)


class ExpertReplay:
    """Within `replaying(targets, recorded)`, the gates take `targets` [N, layers, k] (long) where
    `recorded` [N] is True, and keep their own choice elsewhere (padding, the last token of a row,
    which no rollout forward routed). `force=False` leaves the router's choice alone. With `count`,
    tallies over recorded tokens and all layers how many top-k sets the router chose itself equal
    to the target, before forcing them (`pop_counts`: agreeing, compared)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.gates = moe_gates(model)
        self._agreeing: list[torch.Tensor] = []
        self._compared = 0
        self.seconds = 0.0  # spent in the hooks since the last pop_seconds

    def pop_seconds(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def pop_counts(self) -> tuple[int, int]:
        agreeing = int(sum(int(t) for t in self._agreeing))
        counts = (agreeing, self._compared)
        self._agreeing, self._compared = [], 0
        return counts

    @contextmanager
    def replaying(
        self, targets: torch.Tensor, recorded: torch.Tensor, *, force: bool = True, count: bool = False
    ) -> Iterator[None]:
        if targets.shape[1] != len(self.gates):
            raise ValueError(
                f"routing replay: {targets.shape[1]} recorded MoE layers, the model has {len(self.gates)}"
            )
        recorded = recorded.bool()

        def make_hook(layer: int):
            def hook(module, _args, output):
                started = time.perf_counter()
                try:
                    return replace_output(module, output)
                finally:
                    self.seconds += time.perf_counter() - started

            def replace_output(module, output):
                router_logits, weights, own = output
                if own.shape[0] != targets.shape[0]:
                    raise ValueError(
                        f"routing replay: the forward routes {own.shape[0]} tokens, the layout gives "
                        f"{targets.shape[0]}"
                    )
                target = targets[:, layer].to(own.device, torch.long)
                mask = recorded.to(own.device)
                if count:  # a device tensor: no host sync per layer
                    self._agreeing.append((same_expert_sets(own, target) & mask).sum())
                    self._compared += int(recorded.sum())
                if not force:
                    return output
                indices = torch.where(mask[:, None], target, own)
                return (
                    router_logits,
                    replayed_weights(module, router_logits, indices).to(weights.dtype),
                    indices,
                )

            return hook

        with _hooks(self.gates, make_hook):
            yield
