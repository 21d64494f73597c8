"""The LM head on the response rows only: an `output_processor` for megatron-core's GPTModel.

GPTModel.forward(..., output_processor=f, output_processor_context=rows) (megatron-core 0.19,
models/gpt/gpt_model.py `_postprocess`) hands `f` the decoder's final hidden states [s, b, h]
(after the final norm) and the output layer instead of projecting every position. The actor needs
logits only at the positions that predict a response token, so `project_rows` gathers those rows
and projects them alone: the [s, b, V / TP] logits, their [b, s, V] transposed copy and the
zero-filled [b, s, V] gradient of the gather never exist. With a 160k vocabulary that is a large
share of a train call's FLOPs and memory traffic.

Tensor parallelism (the output layer is a ColumnParallelLinear over the vocabulary):
- without sequence parallelism the hidden states are whole on every TP rank; the layer all-reduces
  the input gradient itself (its allreduce_dgrad);
- with sequence parallelism each rank holds a chunk of the sequence: the chunks are all-gathered
  first, as GPTModel's own inference branch does, whose backward keeps only this rank's chunk
  (tensor_parallel_output_grad=False); the layer runs with sequence_parallel off for the call, so
  it takes the rows as they are and all-reduces their gradient over TP (its
  copy_to_tensor_model_parallel_region). Together: the reduce-scatter the full-sequence path does.
"""

from __future__ import annotations

import torch


def project_rows(
    *,
    hidden_states: torch.Tensor,
    output_layer,
    output_weight,
    context: torch.Tensor,
    scale_logits,
    **_unused,
) -> torch.Tensor:
    """Vocab-parallel logits [N, 1, V / TP] of the hidden states at `context`: N indices into the
    sequence-major flattening of [s, b] (position * b + row)."""
    from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

    sequence_parallel = output_layer.sequence_parallel
    if sequence_parallel:
        hidden_states = gather_from_sequence_parallel_region(
            hidden_states, tensor_parallel_output_grad=False, group=output_layer.tp_group
        )
    s, b, h = hidden_states.shape
    picked = hidden_states.reshape(s * b, h).index_select(0, context).unsqueeze(1)
    output_layer.sequence_parallel = False
    try:
        logits, _ = output_layer(picked, weight=output_weight, runtime_gather_output=False)
    finally:
        output_layer.sequence_parallel = sequence_parallel
    return scale_logits(logits)
