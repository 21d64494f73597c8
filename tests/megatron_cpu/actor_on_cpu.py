"""A MegatronActor on the CPU for tests/megatron_cpu: the actor's own build methods and a plain
training step, under cuda_on_cpu (one gloo rank); hand-made recorded routing for a batch."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlinf.config.schema import (
    ActorConfig,
    AlgorithmConfig,
    Config,
    LRSchedulerConfig,
    ModelConfig,
    OptimConfig,
    RoutingReplayConfig,
)
from rlinf.data.batch import RolloutBatch

VOCAB = 64


def build_actor(
    path,
    moments: str,
    *,
    precision: str = "bf16",
    pack_sequences: bool = False,
    routing_replay: str = "none",
    lr: float = 1e-3,
    lr_sched: LRSchedulerConfig | None = None,
    grouped_experts: bool = False,
):
    """A MegatronActor built by its own methods, minus the CUDA-only constructor (one CPU rank);
    `grouped_experts`: rlinf's grouped-GEMM experts instead of SequentialMLP."""
    from rlinf.algorithms.lr_schedule import lr_multiplier_from_config
    from rlinf.config.megatron_settings import translate
    from rlinf.workers.actor.megatron_actor import MegatronActor
    from rlinf.workers.actor.policy_update import SkipCounter

    model = ModelConfig(
        model_path=str(path),
        precision=precision,
        moe_token_dispatcher_type="allgather",
        moe_grouped_gemm=grouped_experts,
    )
    optim = OptimConfig(
        lr=lr,
        weight_decay=0.01,
        use_precision_aware_optimizer=True,
        exp_avg_dtype=moments,
        exp_avg_sq_dtype=moments,
    )
    actor_cfg = ActorConfig(
        training_backend="megatron",
        seq_length=64,
        model=model,
        optim=optim,
        lr_sched=lr_sched or LRSchedulerConfig(),
        pack_sequences=pack_sequences,
    )
    cfg = Config(
        actor=actor_cfg, algorithm=AlgorithmConfig(routing_replay=RoutingReplayConfig(routing_replay))
    )
    actor = object.__new__(MegatronActor)
    actor.cfg, actor.te_available = cfg, False
    actor.megatron_settings = translate(cfg.actor, te_available=False)
    torch.manual_seed(0)
    actor._build_model(str(path))
    actor._install_routing_replay()
    actor._build_optimizer()
    actor.optimizer_steps, actor.skips = 0, SkipCounter()
    actor.device, actor.tp_size, actor.tp_rank, actor.tp_group = torch.device("cpu"), 1, 0, None
    actor.train_shape, actor.graphs = None, None  # no CUDA graphs on the CPU
    actor.lr_at = lr_multiplier_from_config(cfg)
    return actor


def inner_optimizers(actor) -> list:
    from rlinf.models.megatron.adam_state import optimizer_parts

    return [part.optimizer for part in optimizer_parts(actor.optimizer)]


def masters(actor) -> list[torch.Tensor]:
    return [
        p.detach().clone()
        for inner in inner_optimizers(actor)
        for g in inner.param_groups
        for p in g["params"]
    ]


def moments_of(actor) -> list[torch.Tensor]:
    return [
        state[key].detach().clone()
        for inner in inner_optimizers(actor)
        for g in inner.param_groups
        for p in g["params"]
        for key in ("exp_avg", "exp_avg_sq")
        if key in (state := inner.state[p])
    ]


def train_step(actor, tokens: torch.Tensor, *, counted: bool = False) -> float:
    """Next-token cross-entropy, one optimizer step of megatron's distributed optimizer
    (`counted`: through the actor's optimizer_step, which sets the lr and counts the step)."""
    model = actor.model[0]
    model.zero_grad_buffer()
    actor.optimizer.zero_grad()
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    logits = model(input_ids=tokens[:, :-1], position_ids=positions[:, :-1], attention_mask=None)
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    model.finish_grad_sync()
    if counted:
        actor.optimizer_step()
    else:
        updated, _, _ = actor.optimizer.step()
        assert updated
    return loss.item()


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (4, 17), generator=torch.Generator().manual_seed(seed))


def varied_batch(
    prompt_lens: Sequence[int] = (9, 3, 6, 1, 8, 5),
    response_lens: Sequence[int] = (11, 1, 7, 4, 2, 9),
    *,
    seed: int = 0,
    advantages: Sequence[float] | None = None,
) -> RolloutBatch:
    """One row per (prompt, response) length pair: left-padded prompts and right-padded responses
    as wide as the longest, random token ids (never the pad id 0), GRPO groups of 2 rows, and
    `advantages` (random ones when None)."""
    g = torch.Generator().manual_seed(seed)
    rows, prompt, response = len(prompt_lens), max(prompt_lens), max(response_lens)
    p_len, r_len = torch.tensor(prompt_lens), torch.tensor(response_lens)
    prompt_mask = torch.arange(prompt)[None] >= (prompt - p_len)[:, None]
    response_mask = torch.arange(response)[None] < r_len[:, None]
    prompt_ids = torch.randint(1, VOCAB, (rows, prompt), generator=g).masked_fill(~prompt_mask, 0)
    response_ids = torch.randint(1, VOCAB, (rows, response), generator=g).masked_fill(~response_mask, 0)
    advantages = torch.randn(rows, generator=g) if advantages is None else torch.tensor(advantages)
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        group_index=torch.arange(rows) // 2,
        rollout_logprobs=torch.zeros(rows, response),
        finish_reasons=["stop"] * rows,
        response_text=[""] * rows,
        solutions=[("0",)] * rows,
        advantages=advantages,
    )


def recorded_experts(row: int, position: int, layer: int, experts: int) -> list[int]:
    """The top-2 experts (of the first `experts`) a hand-made rollout routed token `position` (in
    the row's real sequence: prompt, then response) of row `row` to in MoE layer `layer`."""
    first = (row + 2 * position + layer) % experts
    return [first, (first + 1) % experts]


def with_recorded_experts(batch, layers: int, experts: int):
    """`batch` with `recorded_experts` for every token the rollout fed (all but each row's last),
    in the batch fields' layout: left-padded prompt columns, right-padded response columns."""
    rows, prompt_width = batch.prompt_ids.shape
    response_width = batch.response_ids.shape[1]
    batch.prompt_experts = torch.zeros(rows, prompt_width, layers, 2, dtype=torch.uint8)
    batch.response_experts = torch.zeros(rows, response_width, layers, 2, dtype=torch.uint8)
    for i in range(rows):
        p, r = int(batch.prompt_mask[i].sum()), int(batch.response_mask[i].sum())
        for t in range(p + r - 1):
            chosen = torch.tensor([recorded_experts(i, t, layer, experts) for layer in range(layers)])
            if t < p:
                batch.prompt_experts[i, prompt_width - p + t] = chosen
            else:
                batch.response_experts[i, t - p] = chosen
    return batch
