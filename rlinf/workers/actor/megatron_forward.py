"""The Megatron actor's forward: a micro-batch's inputs laid out on the host (right-padded or packed
THD, routing replay targets), every micro-batch of a minibatch moved to the GPU in one copy
(rlinf.workers.actor.staging), and the logprobs and entropy of the response tokens from the LM head
run on the positions that predict them only (rlinf.models.megatron.response_rows). With CUDA graphs
every training micro-batch is padded to the graphs' one shape (`shape`: rows of right padding, or
packed sequences of padding tokens), which no real token attends to and no loss term reads. A mixin
of rlinf.workers.actor.megatron_actor.MegatronActor, whose config, device, TP ranks and routing
replay it reads."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from rlinf.config.megatron_graphs import TrainShape
from rlinf.data.batch import RolloutBatch
from rlinf.workers.actor.staging import to_device_once

# The fields the policy loss reads (rlinf.workers.actor.policy_update._loss_fn).
LOSS_FIELDS = ("response_mask", "old_logprobs", "advantages", "rollout_logprobs", "ref_logprobs")


@dataclass(frozen=True)
class ForwardInputs:
    """One micro-batch's forward, on the host until staged."""

    tokens: torch.Tensor  # [b, T] long: right-padded rows, or [1, T] packed THD
    positions: torch.Tensor  # [b, T] long
    rows: torch.Tensor  # [N] long: position * b + row of the position predicting each response token
    targets: torch.Tensor  # [N] long: those response tokens (row-major order of the response mask)
    slots: torch.Tensor  # [N] long: where each lands in the row-major [b, R] result
    mask: torch.Tensor  # [b, R] bool: the response mask
    cu_seqlens: torch.Tensor | None = None  # [sequences + 1] int32 (packed THD only)
    routing_targets: torch.Tensor | None = None  # routing replay: the routers' token order
    routing_recorded: torch.Tensor | None = None
    max_seqlen: int = 0  # the longest packed sequence (packed THD only)


def slots_of(mask: torch.Tensor) -> torch.Tensor:
    """The row-major flat positions of a mask's True entries."""
    return mask.reshape(-1).nonzero().reshape(-1)


class MegatronForward:
    # --- host layout -------------------------------------------------------------------------------

    def _sp_multiple(self) -> int:
        return self.tp_size if self.cfg.actor.model.sequence_parallel else 1

    def _right_padded(
        self, micro: RolloutBatch, shape: TrainShape | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded tokens [b, T] (prompt then all R response columns; with `shape`, padded to
        its rows and tokens) and each row's prompt length."""
        prompt_lens = micro.prompt_mask.sum(1)
        width = micro.prompt_ids.shape[1]
        r = micro.response_ids.shape[1]
        total = int(prompt_lens.max()) + r
        total = -(-total // self._sp_multiple()) * self._sp_multiple()
        rows = len(micro)
        if shape is not None:
            _fits(shape, rows, total)
            rows, total = shape.rows, shape.tokens
        tokens = torch.zeros(rows, total, dtype=torch.long)
        for i, p in enumerate(prompt_lens.tolist()):
            tokens[i, :p] = micro.prompt_ids[i, width - p :]
            tokens[i, p : p + r] = micro.response_ids[i]
        return tokens, prompt_lens

    def _packed_thd(self, micro: RolloutBatch, shape: TrainShape | None = None):
        """(tokens [1, T], positions [1, T], PackedSeqParams, index [N]), all on the host: every
        row's real tokens back to back (THD, positions restarting per sequence), padded at the end
        to a multiple of TP under sequence parallelism, or to `shape.tokens`, by sequences of
        padding no longer than the longest real one (so the padding's attention costs no more than
        the real tokens'); `index` is the packed position that predicts each real response token,
        in row-major order."""
        from megatron.core.packed_seq_params import PackedSeqParams

        from rlinf.models.logprobs import pack_rows, packed_predictors

        mask = torch.cat([micro.prompt_mask.bool(), micro.response_mask.bool()], dim=1)
        kwargs, where = pack_rows(torch.cat([micro.prompt_ids, micro.response_ids], dim=1), mask)
        index = packed_predictors(where, micro.prompt_ids.shape[1], micro.response_mask)
        lengths = mask.sum(1).tolist()
        tokens, positions = kwargs["input_ids"], kwargs["position_ids"]
        pad = -sum(lengths) % self._sp_multiple()
        if shape is not None:
            _fits(shape, 1, sum(lengths))
            pad = shape.tokens - sum(lengths)
        longest = max(lengths)
        padding = [longest] * (pad // longest) + ([pad % longest] if pad % longest else [])
        if padding:
            tokens = torch.cat([tokens, tokens.new_zeros(1, pad)], dim=1)
            positions = torch.cat([positions, *(torch.arange(n)[None] for n in padding)], dim=1)
            lengths += padding
        bounds = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        params = PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=bounds,
            cu_seqlens_kv=bounds,
            max_seqlen_q=max(lengths),
            max_seqlen_kv=max(lengths),
        )
        return tokens, positions, params, index

    def _routing_layout(self, micro: RolloutBatch, width: int, packed: bool):
        """The micro-batch's recorded experts in the routers' token order of this forward
        (right-padded or packed THD, `width` columns; this rank's chunk under sequence
        parallelism): (targets, recorded) on the host, or (None, None) without routing replay."""
        if self.routing is None:
            return None, None
        from rlinf.data.routing import has_routing, packed_thd_targets, right_padded_targets

        if not has_routing(micro):
            raise ValueError(
                f"algorithm.routing_replay.mode={self.routing_mode}: the batch carries no recorded experts"
            )
        started = time.perf_counter()
        split = self.cfg.actor.model.sequence_parallel and self.tp_size > 1
        layout = packed_thd_targets if packed else right_padded_targets
        targets, recorded = layout(
            micro, width, tp_rank=self.tp_rank if split else 0, tp_size=self.tp_size if split else 1
        )
        self.routing_seconds += time.perf_counter() - started
        return targets, recorded

    def _host_inputs(self, micro: RolloutBatch, shape: TrainShape | None = None) -> ForwardInputs:
        mask = micro.response_mask.bool()
        if self.cfg.actor.pack_sequences:
            tokens, positions, params, rows = self._packed_thd(micro, shape)
            routing = self._routing_layout(micro, tokens.shape[1], packed=True)
            return ForwardInputs(
                tokens, positions, rows, micro.response_ids[mask], slots_of(mask), mask, params.cu_seqlens_q,
                *routing, max_seqlen=params.max_seqlen_q,
            )  # fmt: skip
        tokens, prompt_lens = self._right_padded(micro, shape)
        b, r = mask.shape
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
        # Column p - 1 + j (the token before response token j) predicts response token j; the
        # decoder's output is sequence-major [T, B] (B >= b: padding rows last), so row i's column
        # c is c * B + i.
        columns = (prompt_lens - 1)[:, None] + torch.arange(r)[None]
        rows = (columns * tokens.shape[0] + torch.arange(b)[:, None])[mask]
        routing = self._routing_layout(micro, tokens.shape[1], packed=False)
        return ForwardInputs(
            tokens, positions, rows, micro.response_ids[mask], slots_of(mask), mask, None, *routing
        )

    # --- staging -----------------------------------------------------------------------------------

    def _stage(
        self, micros: Sequence[RolloutBatch], loss_fields: bool = False, shape: TrainShape | None = None
    ) -> list[tuple[RolloutBatch, ForwardInputs]]:
        """Every micro-batch's forward inputs (and with `loss_fields` what the loss reads) on the
        device, moved in one copy; each micro-batch comes back with those fields on the device.
        `shape`: every forward padded to it (the CUDA graphs' shape)."""
        inputs = [self._host_inputs(m, shape) for m in micros]
        names = [f.name for f in fields(ForwardInputs) if f.name != "max_seqlen"]
        carried = LOSS_FIELDS if loss_fields else ()
        host = [getattr(i, n) for i in inputs for n in names]
        host += [getattr(m, n) for m in micros for n in carried]
        moved = iter(to_device_once(host, self.device))
        staged_inputs = [replace(i, **{n: next(moved) for n in names}) for i in inputs]
        staged_micros = [replace(m, **{n: next(moved) for n in carried}) for m in micros]
        return list(zip(staged_micros, staged_inputs, strict=True))

    # --- forward -----------------------------------------------------------------------------------

    def _forward(self, model, inputs: ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Tempered logprobs and entropy [b, R] of the response tokens (0 where masked)."""
        from rlinf.models.megatron.logprobs import vocab_parallel_logprobs
        from rlinf.models.megatron.response_rows import project_rows

        extra: dict = {}
        if inputs.cu_seqlens is not None:
            from megatron.core.packed_seq_params import PackedSeqParams

            extra["packed_seq_params"] = PackedSeqParams(
                qkv_format="thd",
                cu_seqlens_q=inputs.cu_seqlens,
                cu_seqlens_kv=inputs.cu_seqlens,
                max_seqlen_q=inputs.max_seqlen,
                max_seqlen_kv=inputs.max_seqlen,
            )
        if inputs.routing_targets is not None:
            started = time.perf_counter()
            self.routing.set_targets(
                inputs.routing_targets,
                inputs.routing_recorded,
                force=self.routing_mode == "replay",
                count=self.routing_counting,
            )
            self.routing_seconds += time.perf_counter() - started
        if self.cfg.actor.model.precision != "fp32":
            extra["fp32_output"] = False  # kept in the compute dtype; logprobs.py upcasts chunk by chunk
        logits = model(
            input_ids=inputs.tokens,
            position_ids=inputs.positions,
            attention_mask=None,
            output_processor=project_rows,
            output_processor_context=inputs.rows,
            **extra,
        )  # [N, 1, V / TP]
        logprobs, entropy = vocab_parallel_logprobs(
            logits, inputs.targets[:, None], temperature=self.temperature,
            vocab_start=self.tp_rank * logits.shape[-1], group=self.tp_group,
        )  # fmt: skip
        # A scatter to precomputed slots: masked_scatter's backward (masked_select) waits for the host.
        zeros = torch.zeros(inputs.mask.numel(), dtype=logprobs.dtype, device=logprobs.device)
        logprobs, entropy = (
            zeros.scatter(0, inputs.slots, v[:, 0]).view(inputs.mask.shape) for v in (logprobs, entropy)
        )
        return logprobs, entropy

    def _logprobs(self, model, micro: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """`_forward` of one micro-batch, staged on its own."""
        (_, inputs), *_ = self._stage([micro])
        return self._forward(model, inputs)


def _fits(shape: TrainShape, rows: int, tokens: int) -> None:
    """A micro-batch of `rows` x `tokens` fits the graphs' shape (rlinf.config.megatron_graphs)."""
    if rows > shape.rows or tokens > shape.tokens:
        raise ValueError(
            f"a micro-batch of {rows} rows x {tokens} tokens exceeds the CUDA graphs' {shape.rows} x "
            f"{shape.tokens} (actor.micro_batch_size x actor.seq_length; packed: 1 x "
            "actor.max_tokens_per_micro_batch)"
        )
