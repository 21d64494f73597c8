"""The Megatron actor's forward: a micro-batch's inputs laid out on the host (right-padded or packed
THD, routing replay targets), every micro-batch of a minibatch moved to the GPU in one copy
(rlinf.workers.actor.staging), and the logprobs and entropy of the response tokens from the LM head
run on the positions that predict them only (rlinf.models.megatron.response_rows). A mixin of
rlinf.workers.actor.megatron_actor.MegatronActor, whose config, device, TP ranks and routing replay
it reads."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

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
    mask: torch.Tensor  # [b, R] bool: the response mask
    cu_seqlens: torch.Tensor | None = None  # [sequences + 1] int32 (packed THD only)
    routing_targets: torch.Tensor | None = None  # routing replay: the routers' token order
    routing_recorded: torch.Tensor | None = None
    max_seqlen: int = 0  # the longest packed sequence (packed THD only)


class MegatronForward:
    # --- host layout -------------------------------------------------------------------------------

    def _sp_multiple(self) -> int:
        return self.tp_size if self.cfg.actor.model.sequence_parallel else 1

    def _right_padded(self, micro: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded tokens [b, T] (prompt then all R response columns) and each row's prompt length."""
        prompt_lens = micro.prompt_mask.sum(1)
        width = micro.prompt_ids.shape[1]
        r = micro.response_ids.shape[1]
        total = int(prompt_lens.max()) + r
        total = -(-total // self._sp_multiple()) * self._sp_multiple()
        tokens = torch.zeros(len(micro), total, dtype=torch.long)
        for i, p in enumerate(prompt_lens.tolist()):
            tokens[i, :p] = micro.prompt_ids[i, width - p :]
            tokens[i, p : p + r] = micro.response_ids[i]
        return tokens, prompt_lens

    def _packed_thd(self, micro: RolloutBatch):
        """(tokens [1, T], positions [1, T], PackedSeqParams, index [N]), all on the host: every
        row's real tokens back to back (THD, positions restarting per sequence), padded at the end
        to a multiple of TP under sequence parallelism by one more sequence; `index` is the packed
        position that predicts each real response token, in row-major order."""
        from megatron.core.packed_seq_params import PackedSeqParams

        from rlinf.models.logprobs import pack_rows, packed_predictors

        mask = torch.cat([micro.prompt_mask.bool(), micro.response_mask.bool()], dim=1)
        kwargs, where = pack_rows(torch.cat([micro.prompt_ids, micro.response_ids], dim=1), mask)
        index = packed_predictors(where, micro.prompt_ids.shape[1], micro.response_mask)
        lengths = mask.sum(1).tolist()
        tokens, positions = kwargs["input_ids"], kwargs["position_ids"]
        pad = -sum(lengths) % self._sp_multiple()
        if pad:
            tokens = torch.cat([tokens, tokens.new_zeros(1, pad)], dim=1)
            positions = torch.cat([positions, torch.arange(pad)[None]], dim=1)
            lengths.append(pad)
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

    def _host_inputs(self, micro: RolloutBatch) -> ForwardInputs:
        mask = micro.response_mask.bool()
        if self.cfg.actor.pack_sequences:
            tokens, positions, params, rows = self._packed_thd(micro)
            routing = self._routing_layout(micro, tokens.shape[1], packed=True)
            return ForwardInputs(
                tokens, positions, rows, micro.response_ids[mask], mask, params.cu_seqlens_q, *routing,
                max_seqlen=params.max_seqlen_q,
            )  # fmt: skip
        tokens, prompt_lens = self._right_padded(micro)
        b, r = mask.shape
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
        # Column p - 1 + j (the token before response token j) predicts response token j; the
        # decoder's output is sequence-major [T, b], so row i's column c is c * b + i.
        columns = (prompt_lens - 1)[:, None] + torch.arange(r)[None]
        rows = (columns * b + torch.arange(b)[:, None])[mask]
        routing = self._routing_layout(micro, tokens.shape[1], packed=False)
        return ForwardInputs(tokens, positions, rows, micro.response_ids[mask], mask, None, *routing)

    # --- staging -----------------------------------------------------------------------------------

    def _stage(
        self, micros: Sequence[RolloutBatch], loss_fields: bool = False
    ) -> list[tuple[RolloutBatch, ForwardInputs]]:
        """Every micro-batch's forward inputs (and with `loss_fields` what the loss reads) on the
        device, moved in one copy; each micro-batch comes back with those fields on the device."""
        inputs = [self._host_inputs(m) for m in micros]
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
        zeros = torch.zeros(inputs.mask.shape, dtype=logprobs.dtype, device=logprobs.device)
        return zeros.masked_scatter(inputs.mask, logprobs[:, 0]), zeros.masked_scatter(
            inputs.mask, entropy[:, 0]
        )

    def _logprobs(self, model, micro: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """`_forward` of one micro-batch, staged on its own."""
        (_, inputs), *_ = self._stage([micro])
        return self._forward(model, inputs)
