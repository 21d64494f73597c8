"""Pure glue between a recipe and SGLang's offline Engine (sglang 0.5.12): engine arguments, the
per-request sampling dicts, and the parsing of its outputs into the RolloutBatch layout.

Nothing here imports sglang, so all of it is tested on the CPU (tests/unit/test_sglang_args.py);
`sglang_rollout.py` feeds these to the real Engine. Facts this relies on are in
../shared/notes/sglang-engine.md and docs/sglang.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlinf.config.schema import Config
from rlinf.data.batch import padded_rows
from rlinf.workers.rollout.partial import Piece
from rlinf.workers.rollout.sampling import SamplingParams

SGLANG_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# SGLang's memory tags (srt/constants.py). Released weights are NOT kept: push them after resume.
ALL_MEMORY_TAGS = ("kv_cache", "weights", "cuda_graph")
SEED_MODULUS = 2**31 - 1  # sglang turns seeds into uint64 hashes; keep them positive int32-sized


class EngineOutputError(RuntimeError):
    """An engine reply that cannot be turned into a RolloutBatch (aborted, misaligned logprobs)."""


def expert_parallel_size(cfg: Config) -> int:
    """`rollout.sglang.enable_ep_moe` -> SGLang's ep_size. 0.5.12 has no enable_ep_moe flag: EP
    means ep_size > 1, and the experts are split over the engine's TP ranks (ep_size = tp_size)."""
    return cfg.rollout.tensor_parallel_size if cfg.rollout.sglang.enable_ep_moe else 1


def engine_kwargs(
    cfg: Config,
    *,
    model_path: str,
    colocated: bool,
    base_gpu_id: int = 0,
    needs_tokenizer: bool = False,
) -> dict[str, Any]:
    """Keyword arguments for `sglang.Engine(**kwargs)` (ServerArgs fields) for one rollout engine.

    `needs_tokenizer`: SGLang's min_new_tokens penalizer reads the request's tokenizer
    (`req.tokenizer.eos_token_id`), which is None with skip_tokenizer_init, so a recipe with
    min_new_tokens > 0 lets the engine load the checkpoint's tokenizer. Token ids still go in and out.
    """
    r, s = cfg.rollout, cfg.rollout.sglang
    kwargs: dict[str, Any] = {
        "model_path": model_path,
        "dtype": SGLANG_DTYPES[r.model.precision],
        "tp_size": r.tensor_parallel_size,
        "ep_size": expert_parallel_size(cfg),
        "base_gpu_id": base_gpu_id,
        "mem_fraction_static": r.gpu_memory_utilization,
        "attention_backend": s.attention_backend,
        "cuda_graph_max_bs": s.cuda_graph_max_bs,
        "disable_cuda_graph": s.cuda_graph_max_bs == 0,
        "max_running_requests": s.max_running_requests,
        "random_seed": cfg.runner.seed,
        "enable_deterministic_inference": s.deterministic_inference,
        "trust_remote_code": cfg.actor.model.trust_remote_code,
        # We send token ids and read token ids; detokenisation is ours (the grader reads our decode).
        "skip_tokenizer_init": not needs_tokenizer,
        # flashinfer's top-k/top-p kernel rejects per-request seeds; the torch sampler honours them.
        "sampling_backend": "pytorch",
        "grammar_backend": "none",
        # Otherwise about a minute of torch.compile at every engine start.
        "disable_piecewise_cuda_graph": True,
        # Colocated engines hand their memory to the trainer between rollouts (torch_memory_saver).
        "enable_memory_saver": colocated,
        "log_level": "error",
    }
    if s.cuda_graph_max_bs == 0:
        kwargs.pop("cuda_graph_max_bs")
    if cfg.algorithm.routing_replay.mode != "none":  # replies carry each token's experts (sglang_routing.py)
        kwargs["enable_return_routed_experts"] = True
    if s.decode_attention_backend:
        kwargs.update(
            prefill_attention_backend=s.attention_backend, decode_attention_backend=s.decode_attention_backend
        )
    return {k: v for k, v in kwargs.items() if v is not None}


def request_seeds(seed: int, num_requests: int) -> list[int]:
    """One sampling_seed per request, a function of the step seed only (a resumed run draws the
    same seeds). SGLang gives every request without a seed the seed 42, so n samples of one prompt
    would be identical under deterministic inference: each sample gets its own."""
    base = (seed * 2_654_435_761) % SEED_MODULUS
    return [(base + i * 40_503) % SEED_MODULUS for i in range(num_requests)]


def sampling_dicts(
    params: SamplingParams, stop_token_ids: Sequence[int], seeds: Sequence[int]
) -> list[dict[str, Any]]:
    """SGLang sampling_params, one dict per request (each with its own sampling_seed).

    Greedy is temperature 0 (SGLang turns it into top_k=1 and reports logprobs at temperature 1,
    as our convention does). stop_token_ids are the checkpoint's EOS ids; the stop token is part of
    output_ids. skip_special_tokens=False / no_stop_trim keep any text SGLang makes untouched.
    """
    common: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens,
        "min_new_tokens": params.min_new_tokens,
        "stop_token_ids": sorted(int(t) for t in stop_token_ids),
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if params.is_greedy:
        common.update(temperature=0.0, top_p=1.0, top_k=-1)
    else:
        common.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k)
    return [{**common, "sampling_seed": int(seed)} for seed in seeds]


@dataclass
class ParsedOutputs:
    prompt_ids: torch.Tensor  # [B, P] long, left-padded
    prompt_mask: torch.Tensor  # [B, P] bool
    response_ids: torch.Tensor  # [B, R] long, right-padded
    response_mask: torch.Tensor  # [B, R] bool
    logprobs: torch.Tensor  # [B, R] fp32, 0 on padding
    finish_reasons: list[str]  # "stop" | "length"


def reason_kind(meta: dict[str, Any]) -> Any:
    """The kind of a reply's finish reason ("stop", "length", "abort", ...): SGLang sends a dict
    with a "type", or the bare kind."""
    reason = meta.get("finish_reason")
    return reason.get("type") if isinstance(reason, dict) else reason


def finish_reason(meta: dict[str, Any], where: str) -> str:
    reason = meta.get("finish_reason")
    kind = reason_kind(meta)
    if kind in ("stop", "length"):
        return str(kind)
    detail = reason.get("message", "") if isinstance(reason, dict) else ""
    raise EngineOutputError(f"{where}: SGLang finished the request with {kind!r} {detail}".strip())


def continuation_piece(reply: dict[str, Any] | None, where: str) -> Piece:
    """A partial rollout's request reply -> what it generated. An aborted request's reply carries
    the output so far when SGLang sent it; one without aligned tokens and logprobs (or no reply)
    is an empty piece, and the response continues from where it was."""
    meta = (reply or {}).get("meta_info", {})
    if reply is None or reason_kind(meta) == "abort":
        ids = [int(t) for t in (reply or {}).get("output_ids") or []]
        entries = meta.get("output_token_logprobs") or []
        if len(entries) != len(ids) or [int(e[1]) for e in entries] != ids:
            return Piece((), (), "abort")
        return Piece(ids, [float(e[0]) for e in entries], "abort")
    return Piece(*reply_tokens(reply, where))


def reply_tokens(out: dict[str, Any], where: str) -> tuple[list[int], list[float], str]:
    """A finished request's (token ids, their logprobs, finish reason), checked: `output_ids`
    include the final stop token, `meta_info.output_token_logprobs` is a list of
    (logprob, token_id, text) aligned 1:1 with them."""
    ids = [int(t) for t in out["output_ids"]]
    meta = out["meta_info"]
    entries = meta.get("output_token_logprobs")
    if entries is None or len(entries) != len(ids):
        raise EngineOutputError(
            f"{where}: {0 if entries is None else len(entries)} output_token_logprobs for {len(ids)} "
            "output_ids (return_logprob must be on)"
        )
    if [int(e[1]) for e in entries] != ids:
        raise EngineOutputError(f"{where}: output_token_logprobs token ids differ from output_ids")
    if not ids:
        raise EngineOutputError(f"{where}: SGLang returned an empty response")
    return ids, [float(e[0]) for e in entries], finish_reason(meta, where)


def parse_outputs(
    outputs: Sequence[dict[str, Any]], prompts: Sequence[Sequence[int]], pad_token_id: int
) -> ParsedOutputs:
    """Engine replies (one per request, in request order) -> the RolloutBatch tensors (each reply
    checked by `reply_tokens`)."""
    if len(outputs) != len(prompts):
        raise EngineOutputError(f"SGLang returned {len(outputs)} outputs for {len(prompts)} requests")
    responses, logprobs, reasons = [], [], []
    for i, out in enumerate(outputs):
        ids, lps, reason = reply_tokens(out, f"request {i}")
        responses.append(ids)
        logprobs.append(lps)
        reasons.append(reason)
    rows = padded_rows(prompts, responses, logprobs, pad_token_id)
    return ParsedOutputs(
        rows.prompt_ids, rows.prompt_mask, rows.response_ids, rows.response_mask, rows.logprobs, reasons
    )


def decode_responses(parsed: ParsedOutputs, decode: Callable[[list[int]], str]) -> list[str]:
    """Text of each response's real tokens with our tokenizer (what the grader reads)."""
    return [
        decode(ids[mask].tolist())
        for ids, mask in zip(parsed.response_ids, parsed.response_mask, strict=True)
    ]


@dataclass(frozen=True)
class EngineSpan:
    """The GPUs one rollout engine uses: placement indices and the node-local ids of its GPUs."""

    rank: int
    gpus: tuple[int, ...]  # global placement indices

    def local_ids(self, gpus_per_node: int) -> tuple[int, ...]:
        return tuple(g % gpus_per_node for g in self.gpus)


def engine_spans(rollout_gpus: Sequence[int], tp_size: int) -> list[EngineSpan]:
    """Split the rollout's GPUs into consecutive spans of tp_size: one engine (one Ray worker) each.

    An engine may not cross a node: TP runs over NVLink inside one host.
    """
    if tp_size < 1 or len(rollout_gpus) % tp_size:
        raise ValueError(
            f"tensor_parallel_size {tp_size} does not divide the {len(rollout_gpus)} rollout GPUs"
        )
    return [
        EngineSpan(rank, tuple(rollout_gpus[rank * tp_size : (rank + 1) * tp_size]))
        for rank in range(len(rollout_gpus) // tp_size)
    ]


def check_expert_parallel(n_routed_experts: int | None, ep_size: int, where: str) -> None:
    """SGLang needs ep_size to divide the routed experts (and tp_size, which ep_size equals)."""
    if ep_size > 1 and n_routed_experts and n_routed_experts % ep_size:
        raise ValueError(
            f"{where}: expert parallelism over {ep_size} GPUs (rollout.sglang.enable_ep_moe with "
            f"rollout.tensor_parallel_size={ep_size}) needs ep_size to divide the model's "
            f"{n_routed_experts} routed experts"
        )
