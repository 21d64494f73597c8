"""Batched autoregressive sampling with a KV cache: the decoding loop of the torch rollout backend.

We drive the model step by step instead of calling `generate` because RL needs exact token logprobs
and our own sampling rules.

Logprob convention (docs/rollout.md, the same for every rollout backend and for the actor): the
reported logprob of a token is its log-probability under the temperature-scaled FULL distribution,
log_softmax(logits / temperature) in fp32, taken before top-k / top-p truncation and before
min_new_tokens masks EOS (greedy decoding reports temperature 1). SGLang reports the same quantity,
except on the steps min_new_tokens masks, where it reports the renormalised EOS-free distribution
(higher by -log(1 - p_eos); docs/sglang.md, "Logprob semantics"). It is exactly what
`rlinf.models.logprobs.response_logprobs` recomputes for the same tokens, so rollout and actor
logprobs differ only by kernel numerics. It is NOT the probability the token was
drawn with when truncation is on: a top-k / top-p sample was drawn with p(x) / Z (Z = the kept mass),
and no ratio in the loss sees that factor. The config validator warns when a recipe turns it on.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from rlinf.config.schema import SamplingConfig
from rlinf.models.logprobs import positions_from_mask, scale_logits

if TYPE_CHECKING:
    from rlinf.models.routing import ExpertRecorder
    from rlinf.workers.rollout.group_quota import GroupQuota


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # 1.0 = off
    top_k: int = -1  # -1 = off
    max_new_tokens: int = 512
    min_new_tokens: int = 0  # EOS is masked until this many tokens are generated
    greedy: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens must be in [0, max_new_tokens={self.max_new_tokens}], got {self.min_new_tokens}"
            )

    @classmethod
    def from_config(cls, config: SamplingConfig, greedy: bool = False) -> SamplingParams:
        return cls(
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            max_new_tokens=config.max_new_tokens,
            min_new_tokens=config.min_new_tokens,
            greedy=greedy,
        )

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0

    @property
    def logprob_temperature(self) -> float:
        """The temperature reported logprobs are computed at; pass it to `response_logprobs`."""
        return 1.0 if self.is_greedy else self.temperature


@dataclass
class GenerationOutput:
    prompt_ids: torch.Tensor  # [B, P] long, left-padded with pad_token_id
    prompt_mask: torch.Tensor  # [B, P] bool, True on real prompt tokens
    response_ids: torch.Tensor  # [B, R] long, right-padded with pad_token_id
    response_mask: torch.Tensor  # [B, R] bool, True on generated tokens (EOS included)
    logprobs: torch.Tensor  # [B, R] fp32, 0 on padding
    finish_reasons: list[str]  # "stop" (an EOS was produced), "length", or "abort" (the quota ended it)
    # With a recorder: the experts each token was routed to (RolloutBatch.prompt/response_experts)
    prompt_experts: torch.Tensor | None = None  # [B, P, MoE layers, top_k] uint8
    response_experts: torch.Tensor | None = None  # [B, R, MoE layers, top_k] uint8, 0 where not fed


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Logits with the tokens outside the top-k and outside the nucleus set to -inf.

    The nucleus is the smallest set of most likely tokens whose mass reaches top_p (after top-k);
    the most likely token is always kept. Tokens tied with the k-th logit are kept too.
    """
    if 0 < top_k < logits.shape[-1]:
        kth_largest = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, -math.inf)
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop = torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, -math.inf)
    return logits


def choose_next_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    *,
    generator: torch.Generator | None = None,
    blocked_ids: torch.Tensor | None = None,
    blocked_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step for a batch of rows: (tokens [N], reported logprobs [N]) from logits [N, V].

    `blocked_ids` (EOS before min_new_tokens) can never be chosen but keep their reported mass;
    `blocked_rows` (bool [N]): only on those rows (None: on every row).
    """
    scaled = scale_logits(logits, params.logprob_temperature)
    all_logprobs = scaled.log_softmax(-1)
    candidates = scaled
    if blocked_ids is not None:
        candidates = scaled.index_fill(-1, blocked_ids, -math.inf)
        if blocked_rows is not None:
            candidates = torch.where(blocked_rows.unsqueeze(-1), candidates, scaled)
    if params.is_greedy:
        tokens = candidates.argmax(-1)
    else:
        probs = filter_logits(candidates, params.top_k, params.top_p).softmax(-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, all_logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def sample(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    generator: torch.Generator | None = None,
    max_batch_size: int = 256,
    recorder: ExpertRecorder | None = None,
    quota: GroupQuota | None = None,
    generated: Sequence[int] | None = None,
) -> GenerationOutput:
    """Sample one response per prompt, `max_batch_size` prompts decoded together.

    `quota` (rows = prompts): decoding ends as soon as it is met; rows still running then, and the
    rows of chunks not yet started (no response tokens), finish as "abort".

    `generated` (partial rollout): tokens each row's response already has; its prompt ends with
    them, it gets max_new_tokens minus that many more, and EOS stays masked until the whole
    response reaches min_new_tokens.

    `recorder` (installed on `model`): also return the experts every fed token was routed to.

    Results are on the model's device, padded to the longest prompt and response over all chunks.
    `generator` (on the model's device) makes sampling deterministic by its seed.

    Decode steps keep the model's MoE experts implementation (transformers' default grouped_mm).
    `generate` switches to batched_mm for decoding (one gathered copy of an expert's weights per
    token and expert), a slower decode forward on the Moonlight slice (docs/rollout.md).
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("sample() needs at least one prompt and every prompt needs at least one token")
    if not eos_token_ids:
        raise ValueError("eos_token_ids must not be empty")
    generated = [0] * len(prompts) if generated is None else list(generated)
    if len(generated) != len(prompts) or not all(0 <= g < params.max_new_tokens for g in generated):
        raise ValueError(
            f"generated must give each of the {len(prompts)} rows a count in [0, {params.max_new_tokens})"
        )
    device = next(model.parameters()).device
    if generator is not None and generator.device.type != device.type:
        raise ValueError(f"generator is on {generator.device} but the model is on {device}")
    eos_ids = torch.tensor(list(eos_token_ids), dtype=torch.long, device=device)

    # Restore the mode afterwards: the embedded backend may share this module with a training actor.
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), decode_attention_kernels(device), _recording(recorder):
            chunks = [
                _sample_chunk(
                    model,
                    prompts[start : start + max_batch_size],
                    params,
                    eos_ids,
                    pad_token_id,
                    generator,
                    recorder,
                    quota,
                    start,
                    generated[start : start + max_batch_size],
                )
                for start in range(0, len(prompts), max_batch_size)
            ]
    finally:
        model.train(was_training)
    # Outside inference mode on purpose: the results must be usable as inputs to autograd (training).
    return _concatenate(chunks, pad_token_id)


def decode_attention_kernels(device: torch.device):
    """The SDPA kernels decoding may use on `device`: on CUDA every kernel but cuDNN's.

    With a padding mask, torch 2.11 on Hopper sends SDPA to cuDNN first, and cuDNN builds an
    execution plan for every new shape (batch, key length). Decoding makes a new shape at every
    step (the key length grows by one; finished rows leave the batch), so every step would pay a
    plan build (the same cost is reported in modelscope/FunASR#3704). Flash / memory-efficient /
    math need no plan. A context manager; the flags are restored on exit (the module may be shared
    with a training actor). Elsewhere (CPU) nothing changes.
    """
    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _recording(recorder: ExpertRecorder | None):
    return contextlib.nullcontext() if recorder is None else recorder.recording()


def _sample_chunk(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    eos_ids: torch.Tensor,
    pad_token_id: int,
    generator: torch.Generator | None,
    recorder: ExpertRecorder | None = None,
    quota: GroupQuota | None = None,
    first_row: int = 0,
    generated: Sequence[int] = (),
) -> GenerationOutput:
    device = eos_ids.device
    prompt_len = max(len(p) for p in prompts)
    prompt_ids = torch.tensor(
        [[pad_token_id] * (prompt_len - len(p)) + list(p) for p in prompts], dtype=torch.long
    ).to(device)
    prompt_mask = torch.tensor([[False] * (prompt_len - len(p)) + [True] * len(p) for p in prompts]).to(
        device
    )

    batch = len(prompts)
    already = torch.tensor(list(generated) or [0] * batch, dtype=torch.long, device=device)
    budgets = params.max_new_tokens - already  # tokens each row may still generate
    max_new = int(budgets.max())
    if quota is not None and quota.met:  # an earlier chunk met it: nothing to decode here
        max_new = 0
    response_ids = torch.full((batch, max_new), pad_token_id, dtype=torch.long, device=device)
    response_mask = torch.zeros((batch, max_new), dtype=torch.bool, device=device)
    logprobs = torch.zeros((batch, max_new), dtype=torch.float32, device=device)
    stopped = torch.zeros(batch, dtype=torch.bool, device=device)
    ended = torch.zeros(batch, dtype=torch.bool, device=device)  # by EOS or the length limit
    if max_new == 0:
        return GenerationOutput(
            prompt_ids, prompt_mask, response_ids, response_mask, logprobs, ["abort"] * batch
        )
    cache = DynamicCache(config=model.config)
    attention_mask = prompt_mask
    logits = model(
        input_ids=prompt_ids,
        attention_mask=attention_mask,
        position_ids=positions_from_mask(prompt_mask),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]
    prompt_experts = response_experts = None
    if recorder is not None:
        prompt_experts = recorder.take().unflatten(0, (batch, prompt_len))
        response_experts = prompt_experts.new_zeros((batch, max_new, *prompt_experts.shape[2:]))
    # The new token's position is the number of real tokens before it, whatever the left padding.
    next_position = prompt_mask.sum(-1, keepdim=True)
    # Finished rows leave the batch (and the cache), so later steps only compute live rows.
    rows = torch.arange(batch, device=device)
    num_live = batch
    for step in range(max_new):
        blocked = blocked_rows = None
        if params.min_new_tokens > 0:
            blocked_rows = already[rows] + step < params.min_new_tokens
            blocked = eos_ids if bool(blocked_rows.any()) else None
        tokens, token_logprobs = choose_next_tokens(
            logits, params, generator=generator, blocked_ids=blocked, blocked_rows=blocked_rows
        )
        response_ids[rows, step] = tokens
        logprobs[rows, step] = token_logprobs
        response_mask[rows, step] = True
        hit_eos = torch.isin(tokens, eos_ids)
        stopped[rows] = hit_eos
        finished = hit_eos | (budgets[rows] == step + 1)
        ended[rows[finished]] = True
        if quota is not None:
            quota.finish([first_row + int(r) for r in rows[finished].tolist()])
        live = ~finished
        now_live = int(live.sum())
        if now_live == 0 or (quota is not None and quota.met):
            break
        if now_live < num_live:
            keep = live.nonzero().squeeze(-1)
            rows, tokens, next_position, attention_mask = (
                rows[keep],
                tokens[keep],
                next_position[keep],
                attention_mask[keep],
            )
            cache.batch_select_indices(keep)
            num_live = now_live
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(num_live, 1)], dim=1)
        logits = model(
            input_ids=tokens.unsqueeze(-1),
            attention_mask=attention_mask,
            position_ids=next_position,
            past_key_values=cache,
            use_cache=True,
        ).logits[:, -1]
        if response_experts is not None:  # the forward just routed response column `step`
            response_experts[rows, step] = recorder.take()  # type: ignore[union-attr]
        next_position = next_position + 1

    num_steps = step + 1
    return GenerationOutput(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids[:, :num_steps],
        response_mask=response_mask[:, :num_steps],
        logprobs=logprobs[:, :num_steps],
        finish_reasons=[
            "stop" if s else "length" if e else "abort"
            for s, e in zip(stopped.tolist(), ended.tolist(), strict=True)
        ],
        prompt_experts=prompt_experts,
        response_experts=None if response_experts is None else response_experts[:, :num_steps],
    )


def _concatenate(chunks: list[GenerationOutput], pad_token_id: int) -> GenerationOutput:
    """Stack chunks into fresh tensors: prompts left-padded, responses right-padded to common widths."""
    batch = sum(c.prompt_ids.shape[0] for c in chunks)
    prompt_len = max(c.prompt_ids.shape[1] for c in chunks)
    response_len = max(c.response_ids.shape[1] for c in chunks)
    first = chunks[0]
    prompt_ids = first.prompt_ids.new_full((batch, prompt_len), pad_token_id)
    prompt_mask = first.prompt_mask.new_zeros((batch, prompt_len))
    response_ids = first.response_ids.new_full((batch, response_len), pad_token_id)
    response_mask = first.response_mask.new_zeros((batch, response_len))
    logprobs = first.logprobs.new_zeros((batch, response_len))
    prompt_experts = response_experts = None
    if first.prompt_experts is not None and first.response_experts is not None:
        prompt_experts = first.prompt_experts.new_zeros((batch, prompt_len, *first.prompt_experts.shape[2:]))
        response_experts = first.response_experts.new_zeros(
            (batch, response_len, *first.response_experts.shape[2:])
        )
    row = 0
    for c in chunks:
        n, p, r = c.prompt_ids.shape[0], c.prompt_ids.shape[1], c.response_ids.shape[1]
        prompt_ids[row : row + n, prompt_len - p :] = c.prompt_ids
        prompt_mask[row : row + n, prompt_len - p :] = c.prompt_mask
        response_ids[row : row + n, :r] = c.response_ids
        response_mask[row : row + n, :r] = c.response_mask
        logprobs[row : row + n, :r] = c.logprobs
        if c.prompt_experts is not None and c.response_experts is not None:  # none where nothing ran
            prompt_experts[row : row + n, prompt_len - p :] = c.prompt_experts  # type: ignore[index]
            response_experts[row : row + n, :r] = c.response_experts  # type: ignore[index]
        row += n
    return GenerationOutput(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        logprobs=logprobs,
        finish_reasons=[reason for c in chunks for reason in c.finish_reasons],
        prompt_experts=prompt_experts,
        response_experts=response_experts,
    )
