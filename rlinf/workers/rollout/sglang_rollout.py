"""The SGLang rollout: one Ray worker per rollout data-parallel group, each owning one offline
Engine over `rollout.tensor_parallel_size` GPUs (docs/sglang.md).

Token ids go in and out; our tokenizer decodes the responses for the grader. Logprobs are SGLang's
`output_token_logprobs` of the sampled tokens (log-softmax of logits / temperature before top-k /
top-p, after the min_new_tokens EOS mask; docs/sglang.md, "Logprob semantics").
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from rlinf.config.run_record import announce
from rlinf.config.schema import Config
from rlinf.config.validate import placement_of
from rlinf.data.batch import RolloutBatch
from rlinf.data.datasets import PromptItem
from rlinf.weight_sync.plan import CUDA_IPC, NCCL, OBJECT_STORE, WEIGHT_GROUP_NAME, gpu_uuid
from rlinf.workers.common import eos_token_ids, pad_token_id
from rlinf.workers.rollout.base import RolloutWorker, WeightBucket, group_quota
from rlinf.workers.rollout.partial import (
    GroupInFlight,
    PartialRollout,
    continuations,
    finish_step,
    step_quota,
)
from rlinf.workers.rollout.sampling import SamplingParams
from rlinf.workers.rollout.sglang_args import (
    ALL_MEMORY_TAGS,
    check_expert_parallel,
    continuation_piece,
    decode_responses,
    engine_spans,
    expert_parallel_size,
    parse_outputs,
    request_seeds,
    sampling_dicts,
)
from rlinf.workers.rollout.sglang_engine import SGLangEngine, import_sglang
from rlinf.workers.rollout.sglang_settings import (
    ENGINE_RECORD_FILE,
    check_flashmla,
    engine_record,
    engine_settings,
)

logger = logging.getLogger(__name__)


class SGLangRollout(RolloutWorker):
    def __init__(self, cfg: Config, *, rank: int = 0, world_size: int = 1) -> None:
        import_sglang()  # the install hint before anything else
        from rlinf.models.hf_checkpoint import load_tokenizer
        from rlinf.models.tiny import resolve_model_path

        self.cfg, self.rank = cfg, rank
        r = cfg.rollout
        self.tp_size = r.tensor_parallel_size
        placement = placement_of(cfg)
        self.colocated = placement.is_colocated("actor", "rollout")
        span = engine_spans(placement.gpus["rollout"], self.tp_size)[rank]
        self.where = f"rollout engine (rank {rank} of {world_size}, GPUs {list(span.gpus)})"
        self._select_gpus(span.local_ids(cfg.cluster.num_gpus_per_node or len(span.gpus)))
        self.model_path = resolve_model_path(r.model.model_path or cfg.actor.model.model_path)
        hf_config = _hf_config(self.model_path)
        check_expert_parallel(hf_config.get("n_routed_experts"), expert_parallel_size(cfg), self.where)
        self.routing = None
        if cfg.algorithm.routing_replay.mode != "none":
            from rlinf.workers.rollout.sglang_routing import EngineRouting

            self.routing = EngineRouting.from_hf_config(hf_config)
        self.tokenizer = load_tokenizer(self.model_path, trust_remote_code=cfg.actor.model.trust_remote_code)
        self.eos_ids = eos_token_ids(_generation_config(self.model_path), self.tokenizer)
        self.pad_id = pad_token_id(self.tokenizer, self.eos_ids)
        settings = engine_settings(
            cfg,
            model_path=self.model_path,
            hf_config=hf_config,
            colocated=self.colocated,
            needs_tokenizer=cfg.algorithm.sampling_params.min_new_tokens > 0,
        )
        check_flashmla(settings.kwargs, self.where)
        if rank == 0:
            announce(
                "sglang rollout: engine",
                engine_record(settings),
                cfg.runner.logger.log_path,
                ENGINE_RECORD_FILE,
            )
        # Our tuned MoE kernel tables where they cover this engine's expert shape, and the sampler
        # plugin (the engine's processes inherit this process's environment).
        os.environ.update(settings.env)
        self.engine = SGLangEngine(settings.kwargs, where=self.where)

    def _select_gpus(self, local_ids: Sequence[int]) -> None:
        """Ray shows this worker only its own GPU; a TP engine needs the whole span (its children
        inherit CUDA_VISIBLE_DEVICES). The span must start at the GPU Ray gave us."""
        if len(local_ids) == 1:
            return  # base_gpu_id 0 of what Ray made visible
        import ray

        assigned = [int(g) for g in ray.get_gpu_ids()] if ray.is_initialized() else []
        if assigned and assigned[0] != local_ids[0]:
            raise RuntimeError(
                f"{self.where}: Ray placed this worker on GPU {assigned[0]}, but its engine's span "
                f"starts at GPU {local_ids[0]}; the placement group's bundles are not in GPU order"
            )
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in local_ids)

    # -- generation ---------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[PromptItem],
        n: int,
        params: SamplingParams,
        seed: int,
        keep_groups: int | None = None,
    ) -> RolloutBatch:
        # n separate requests per prompt (prompt-major), each with its own seed: samples differ.
        repeated = [item for item in prompts for _ in range(n)]
        input_ids = [list(item.prompt_ids) for item in repeated]
        requests = sampling_dicts(params, self.eos_ids, request_seeds(seed, len(input_ids)))
        quota = group_quota(len(prompts), n, keep_groups)
        replies = self.engine.generate(
            input_ids, requests, return_routed_experts=self.routing is not None, quota=quota
        )
        if quota is not None:  # only the kept groups' rows, which all finished (group_quota.py)
            rows = quota.kept_rows()
            repeated, input_ids = [repeated[r] for r in rows], [input_ids[r] for r in rows]
            replies, prompts = [replies[r] for r in rows], [prompts[r // n] for r in rows[::n]]
        outputs = [reply for reply in replies if reply is not None]
        parsed = parse_outputs(outputs, input_ids, self.pad_id)
        texts = decode_responses(parsed, self.response_text)
        return RolloutBatch(
            prompt_ids=parsed.prompt_ids,
            prompt_mask=parsed.prompt_mask,
            response_ids=parsed.response_ids,
            response_mask=parsed.response_mask,
            group_index=torch.arange(len(prompts)).repeat_interleave(n),
            rollout_logprobs=parsed.logprobs,
            finish_reasons=parsed.finish_reasons,
            response_text=texts,
            solutions=[item.solutions for item in repeated],
            **self._routed_experts(outputs, parsed),
        )

    def generate_partial(
        self, groups: Sequence[GroupInFlight], params: SamplingParams, seed: int, keep_groups: int
    ) -> PartialRollout:
        # One request per unfinished response: prompt + its tokens so far, with the budget it has left.
        requests = continuations(groups, params.max_new_tokens)
        quota = step_quota(groups, requests, keep_groups)
        dicts = [
            {
                **common,
                "max_new_tokens": r.max_new_tokens,
                "min_new_tokens": max(0, params.min_new_tokens - r.generated),
            }
            for common, r in zip(
                sampling_dicts(params, self.eos_ids, request_seeds(seed, len(requests))),
                requests,
                strict=True,
            )
        ]
        replies = (
            self.engine.generate([r.input_ids for r in requests], dicts, quota=quota) if requests else []
        )
        pieces = [continuation_piece(reply, f"request {i}") for i, reply in enumerate(replies)]
        return finish_step(groups, requests, pieces, quota, self.pad_id, self.response_text)

    def _routed_experts(self, outputs: list[dict], parsed) -> dict:
        """algorithm.routing_replay: the replies' routed experts as RolloutBatch fields (and the
        seconds the conversion took)."""
        if self.routing is None:
            return {}
        from rlinf.workers.rollout.sglang_routing import routed_experts

        started = time.perf_counter()
        prompt, response = routed_experts(
            outputs,
            parsed.prompt_mask.sum(1).tolist(),
            parsed.response_mask.sum(1).tolist(),
            parsed.prompt_ids.shape[1],
            parsed.response_ids.shape[1],
            self.routing,
        )
        return {
            "prompt_experts": prompt,
            "response_experts": response,
            "extras": {"time/routing_record": time.perf_counter() - started},
        }

    # -- weights (driven by rlinf.weight_sync) ------------------------------------------------
    def weight_sync_info(self) -> dict:
        # TP rank j runs on visible GPU j (base_gpu_id 0 of the span this worker made visible).
        gpus = [gpu_uuid(tp_rank) for tp_rank in range(self.tp_size)]
        return {"methods": (CUDA_IPC, NCCL, OBJECT_STORE), "tp_size": self.tp_size, "gpu_uuids": gpus}

    def update_weights(self, buckets: Sequence[WeightBucket]) -> None:
        """Object-store path: CPU buckets (SGLang shares them with its TP ranks by shared memory)."""
        self.engine.resume(["weights"])
        for bucket in buckets:
            self.engine.load_tensors(list(bucket))
        self.engine.flush_cache()
        self.engine.resume(ALL_MEMORY_TAGS)

    def update_weights_ipc(self, handles: Sequence[bytes]) -> None:
        """One bucket as CUDA IPC handles, one per TP rank in TP order, each made on that rank's GPU
        (rlinf.weight_sync.sync_cuda_ipc pairs them)."""
        if len(handles) != self.tp_size:
            raise ValueError(f"{self.where}: got {len(handles)} IPC handles for {self.tp_size} TP ranks")
        self.engine.load_tensors(list(handles), flattened=True)

    def init_weight_group(self, host: str, port: int, rank_offset: int, world_size: int, name: str) -> None:
        self.engine.join_weight_group(host, port, rank_offset, world_size, name)

    def update_weights_nccl(self, names, dtypes, shapes) -> None:
        self.engine.receive_broadcast(names, dtypes, shapes, WEIGHT_GROUP_NAME)

    def flush_cache(self) -> None:
        self.engine.flush_cache()

    # -- memory (colocated runs) --------------------------------------------------------------
    def sleep(self, tags: Sequence[str] | None = None) -> None:
        """Release `tags` (default: KV cache, CUDA graphs and weights) for training (no-op unless
        colocated)."""
        self.engine.release(tuple(tags) if tags else ALL_MEMORY_TAGS)

    def wake(self, tags: Sequence[str] | None = None) -> None:
        """Resume `tags` (all by default). Resumed weights are empty until the next weight sync,
        which resumes "weights" itself first and the KV cache after the push."""
        self.engine.resume(tuple(tags) if tags else ALL_MEMORY_TAGS)

    def memory_state(self) -> dict:
        return {"released": sorted(self.engine.released), "weights_stale": self.engine.weights_stale}

    def close(self) -> None:
        self.engine.shutdown()


def _hf_config(model_path: str) -> dict:
    config = Path(model_path) / "config.json"
    return json.loads(config.read_text()) if config.is_file() else {}


def _generation_config(model_path: str):
    """The checkpoint's GenerationConfig, whose EOS ids count; None without generation_config.json
    (the tokenizer's EOS only)."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model_path)
    except OSError:
        return None
