"""MoE routing replay in megatron-core: every TopKRouter takes the rollout's recorded experts.

megatron-core's `topk_routing_with_score_function` asks `router.router_replay.get_replay_topk(scores,
topk, num_groups, group_topk, default_compute_topk)` for the top-k of the (bias-corrected) scores
whenever a router has one (megatron-core's own `RouterReplay` answers from per-layer index lists;
it cannot compare the router's own choice with the target, which `routing/agreement` needs).
`ReplayTopk` answers the same call: it computes the router's own top-k, counts its agreement with
the target, and returns the target with the scores gathered there. megatron-core then takes the
weights from the UNBIASED full scores at those indices (sigmoid, or softmax), normalises them and
applies the scaling factor, as for its own choice, so gradients reach the replayed experts' router
rows. The fused router kernel (moe_router_fusion) never asks, so it is refused.

Targets are set per micro-batch before its forward and stay until the next one: with activation
recompute, the backward reruns the router and must see the same targets.
"""

from __future__ import annotations

import time

import torch

from rlinf.models.routing import RoutingReplayError, same_expert_sets


class ReplayTopk:
    """Stands in a TopKRouter's `router_replay` slot for one MoE layer."""

    def __init__(self) -> None:
        self.target: torch.Tensor | None = None  # [tokens, k] long
        self.recorded: torch.Tensor | None = None  # [tokens] bool
        self.force = False
        self.count = False
        self.agreeing: list[torch.Tensor] = []
        self.compared = 0
        self.seconds = 0.0

    def get_replay_topk(self, scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
        started = time.perf_counter()
        try:
            return self._topk(scores, topk, num_groups, group_topk, default_compute_topk)
        finally:
            self.seconds += time.perf_counter() - started

    def _topk(self, scores, topk, num_groups, group_topk, default_compute_topk):
        probs, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        if self.target is None or self.recorded is None:
            return probs, own
        if self.target.shape[0] != own.shape[0]:
            raise ValueError(
                f"routing replay: the router sees {own.shape[0]} tokens, the layout gives {self.target.shape[0]}"
            )
        if self.count:
            self.agreeing.append((same_expert_sets(own, self.target) & self.recorded).sum())
            self.compared += int(self.recorded.sum())
        if not self.force:
            return probs, own
        indices = torch.where(self.recorded[:, None], self.target, own)
        return scores.gather(1, indices), indices


class MegatronRoutingReplay:
    """The ReplayTopk of every MoE layer of a megatron model chunk, in layer order."""

    def __init__(self, model: torch.nn.Module) -> None:
        from megatron.core.transformer.moe.router import TopKRouter

        routers = [m for m in model.modules() if isinstance(m, TopKRouter)]
        if not routers:
            raise RoutingReplayError("algorithm.routing_replay.mode: the megatron model has no MoE router")
        if any(r.config.moe_router_fusion for r in routers):
            raise RoutingReplayError(
                "algorithm.routing_replay.mode: megatron's fused router kernel (moe_router_fusion) cannot "
                "replay experts; it must be off"
            )
        self.layers = [ReplayTopk() for _ in routers]
        for router, layer in zip(routers, self.layers, strict=True):
            router.router_replay = layer

    def set_targets(self, targets: torch.Tensor, recorded: torch.Tensor, *, force: bool, count: bool) -> None:
        """`targets` [tokens, layers, k], `recorded` [tokens], in the routers' token order."""
        if targets.shape[1] != len(self.layers):
            raise ValueError(
                f"routing replay: {targets.shape[1]} recorded MoE layers, the model has {len(self.layers)}"
            )
        recorded = recorded.bool()
        for index, layer in enumerate(self.layers):
            layer.target, layer.recorded = targets[:, index], recorded
            layer.force, layer.count = force, count

    def clear(self) -> None:
        for layer in self.layers:
            layer.target = layer.recorded = None

    def pop_seconds(self) -> float:
        seconds = sum(layer.seconds for layer in self.layers)
        for layer in self.layers:
            layer.seconds = 0.0
        return seconds

    def pop_counts(self) -> tuple[int, int]:
        agreeing = sum(int(t) for layer in self.layers for t in layer.agreeing)
        compared = sum(layer.compared for layer in self.layers)
        for layer in self.layers:
            layer.agreeing, layer.compared = [], 0
        return agreeing, compared
