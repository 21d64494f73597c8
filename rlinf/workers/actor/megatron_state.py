"""The Megatron actor's state off the GPU and on disk: offload / onload of its buffers and
optimizer state (colocated with the rollout), and its dist-checkpoints (every rank writes its
shards, its RNG; rank 0 the loop counters). A mixin of rlinf.workers.actor.megatron_actor.MegatronActor,
whose model, optimizer, settings and counters it reads."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path

import torch

from rlinf.models.megatron.adam_state import adam_step_count, ensure_adam_states, set_adam_steps
from rlinf.models.megatron.cuda_graphs import rng_states_like
from rlinf.utils.checkpoint import CheckpointError
from rlinf.workers.actor.policy_update import SkipCounter

logger = logging.getLogger(__name__)

DIST_CKPT_DIR = "megatron"
RNG_FILE = "rng_rank{rank}.pt"
LOOP_STATE_FILE = "actor_loop_state.pt"
# The order in which the grouped-GEMM experts register their weights (grouped_experts.ExpertLinears),
# which fixes where their optimizer state sits in the saved flat buffers; checkpoints without the key
# were written in the first-to-last order.
EXPERT_WEIGHT_ORDER = "last_to_first"


def _without_psutil_memory_log() -> None:
    """megatron-core's checkpoint writer measures its RSS with psutil only to log it, and raises when
    psutil is missing (the GPU image has none outside Ray). Without psutil the measurement reads 0."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if not filesystem_async.HAVE_PSUTIL:
        filesystem_async._process_memory = lambda: 0


def _with_peak_lr(optimizer_state: object, lr: float) -> None:
    """megatron pairs the saved param groups with the optimizer's by their settings, max_lr and
    min_lr among them (both optim.lr: rlinf.config.megatron_settings). rlinf sets each step's LR
    itself from the schedule, so those two only name the group: set to this run's, a run resumed
    with another optim.lr (actor.lr_sched.on_resume=override) finds its groups."""
    if isinstance(optimizer_state, dict):
        for key, value in optimizer_state.items():
            if key == "param_groups" and isinstance(value, list):
                for group in value:
                    group.update({name: lr for name in ("max_lr", "min_lr") if name in group})
            else:
                _with_peak_lr(value, lr)


class MegatronActorState:
    # --- memory ------------------------------------------------------------------------------------

    def _buffers(self):
        for chunk in self.model:
            yield from chunk.buffers
            yield from chunk.expert_parallel_buffers

    def offload(self) -> dict[str, float]:
        """Param and grad buffers and optimizer state to CPU; returns the GPU memory freed (GiB)."""
        if self.offloaded:
            return {"actor/offload_freed_gib": 0.0}
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        from rlinf.models.megatron.optimizer_offload import offload_optimizer_state

        if self.graphs is not None:  # they point into the buffers that move (models/megatron/cuda_graphs.py)
            self.graphs.release()
        for buffer in self._buffers():
            buffer.offload_to_cpu(move_params=True, move_grads=True)
        offload_optimizer_state(self.optimizer)  # not megatron's: see optimizer_offload.py
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        self.offloaded = True
        freed = (before - torch.cuda.memory_allocated()) / 2**30
        logger.info("megatron actor offload: %.2f GiB freed", freed)
        return {"actor/offload_freed_gib": freed}

    def onload(self) -> None:
        if not self.offloaded:
            return
        from rlinf.models.megatron.optimizer_offload import restore_optimizer_state

        for buffer in self._buffers():
            buffer.reload_from_cpu(move_params=True, move_grads=True)
        restore_optimizer_state(self.optimizer)
        torch.cuda.synchronize()
        self.offloaded = False

    # --- checkpoints -------------------------------------------------------------------------------

    def _sharded_state(self, is_loading: bool, weights_only: bool = False) -> dict:
        from megatron.core import parallel_state

        # Megatron-LM's torch_dist defaults: the distributed optimizer's state as one ShardedTensor per
        # contiguous buffer ("dp_reshardable": fully parallel, no gathers). The older default,
        # "fully_sharded_model_space", fails in 0.19.2 ("ShardedTensor.flattened_range is not supported").
        metadata = {
            "distrib_optim_sharding_type": "dp_reshardable",
            "singleton_local_shards": False,
            "chained_optim_avoid_prefix": True,
            "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True),
        }
        model_state = self.model[0].module.sharded_state_dict(metadata=metadata)
        if weights_only:
            return {"model": model_state}
        optimizer_state = self.optimizer.sharded_state_dict(
            model_state, is_loading=is_loading, metadata=metadata
        )
        return {"model": model_state, "optimizer": optimizer_state}

    @contextmanager
    def _resident(self):
        """Weights and optimizer state on the GPU for the duration (an offloaded actor's buffers have
        no storage, and megatron fails to read or write a checkpoint into them); offloaded again
        afterwards."""
        was_offloaded = self.offloaded
        self.onload()
        try:
            yield
        finally:
            if was_offloaded:
                self.offload()

    def save(self, directory: str) -> int:
        with self._resident():
            self._save(directory)
        return self.optimizer_steps

    def load(self, directory: str, weights_only: bool = False) -> None:
        """`weights_only`: the model's weights alone (an export), not the optimizer state, RNG and
        counters a resumed run needs; a fraction of the bytes (Adam moments and fp32 masters are most
        of a checkpoint)."""
        with self._resident():
            self._load(directory, weights_only)

    def export_hf(self, directory: str) -> None:
        """Collective: every rank takes part in the bridge's gathers (the weight sync's export);
        global rank 0 writes the folder, with the base checkpoint's config and tokenizer."""
        import torch.distributed as dist

        from rlinf.models.hf_export import write_hf_folder
        from rlinf.models.tiny import resolve_model_path

        m = self.cfg.actor.model
        with self._resident():
            if dist.get_rank() == 0:
                write_hf_folder(
                    self.iter_hf_weights(cpu=True),
                    resolve_model_path(m.model_path),
                    Path(directory),
                    trust_remote_code=m.trust_remote_code,
                )
            else:
                for _ in self.iter_hf_weights(cpu=False):  # each gathered copy is dropped at once
                    pass
        dist.barrier()

    def _adam_moments(self) -> list[str]:
        """The dtypes (exp_avg, exp_avg_sq) this actor's optimizer keeps its Adam moments in."""
        o = self.cfg.actor.optim
        return [o.exp_avg_dtype, o.exp_avg_sq_dtype] if o.use_precision_aware_optimizer else ["fp32", "fp32"]

    def _check_same_layout(self, path: Path, loop: dict, weights_only: bool = False) -> None:
        """What a checkpoint's optimizer state must share with this actor to load into it.

        - The experts: the distributed optimizer's state is saved as flat buffers in parameter
          order, which differs between SequentialMLP and the grouped-GEMM experts, so loading across
          a change of `actor.model.moe_grouped_gemm` (or `moe_grouped_gemm_impl`) would hand Adam
          states to the wrong weights, silently. The same holds across a change of the order the
          grouped experts register their weights in (`expert_weight_order`); a weights-only load
          (an export) reads weights by name and takes any order.
        - The Adam moments' dtypes: megatron's loader cannot read one dtype into another (it fails
          with an empty message).
        - The layer spec: TE's and the TE-free one name and shape parameters differently."""
        from rlinf.models.megatron.bridge import TE_FREE_SPEC, spec_name

        written_spec = loop.get("spec", TE_FREE_SPEC)  # older checkpoints: only the TE-free spec ran
        if written_spec != spec_name(self.te_available):
            raise CheckpointError(
                f"{path}: written with the {written_spec} layer spec, this run builds the "
                f"{spec_name(self.te_available)} one; resume where the same spec runs (with Transformer Engine "
                "installed, RLINF_MEGATRON_TE=off selects the TE-free spec)"
            )
        written = loop.get("grouped_experts", False)
        if written != self.megatron_settings.grouped_experts:
            raise CheckpointError(
                f"{path}: written with the grouped-GEMM experts {'on' if written else 'off'} "
                "(actor.model.moe_grouped_gemm / moe_grouped_gemm_impl); resume with the same setting"
            )
        order = loop.get("expert_weight_order", "first_to_last")
        if written and order != EXPERT_WEIGHT_ORDER and not weights_only:
            raise CheckpointError(
                f"{path}: its optimizer state follows an earlier parameter order of the grouped-GEMM "
                "experts, which this version no longer builds, so it cannot resume; its weights still "
                f"load: export them (python -m rlinf.export_hf {path} OUT_DIR) and start a run from OUT_DIR"
            )
        moments = list(loop.get("adam_moments", ["fp32", "fp32"]))
        if moments != self._adam_moments():
            raise CheckpointError(
                f"{path}: written with Adam moments in {'/'.join(moments)} (actor.optim.exp_avg_dtype / "
                f"exp_avg_sq_dtype with use_precision_aware_optimizer), this run keeps them in "
                f"{'/'.join(self._adam_moments())}; resume with the same setting"
            )

    def _save(self, directory: str) -> None:
        """Collective: every rank writes its shards (weights, distributed optimizer) and its RNG."""
        import torch.distributed as dist
        from megatron.core import dist_checkpointing, tensor_parallel

        from rlinf.models.megatron.bridge import spec_name

        path = Path(directory)
        ckpt = path / DIST_CKPT_DIR
        if dist.get_rank() == 0:
            ckpt.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        _without_psutil_memory_log()
        if not self.te_available:  # rlinf.models.megatron.adam_state: megatron trips over `step`
            ensure_adam_states(self.optimizer)
        dist_checkpointing.save(self._sharded_state(is_loading=False), str(ckpt))
        rng = {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(),
            "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
        }
        torch.save(rng, path / RNG_FILE.format(rank=dist.get_rank()))
        if dist.get_rank() == 0:
            loop = {
                "optimizer_steps": self.optimizer_steps,
                "skips": (self.skips.consecutive, self.skips.total),
                "spec": spec_name(self.te_available),
                "grouped_experts": self.megatron_settings.grouped_experts,
                "expert_weight_order": EXPERT_WEIGHT_ORDER,
                "adam_moments": self._adam_moments(),
                "adam_steps": adam_step_count(self.optimizer),
            }
            torch.save(loop, path / LOOP_STATE_FILE)
        dist.barrier()

    def _load(self, directory: str, weights_only: bool = False) -> None:
        import torch.distributed as dist
        from megatron.core import dist_checkpointing, tensor_parallel

        path = Path(directory)
        ckpt = path / DIST_CKPT_DIR
        for needed in (ckpt, path / LOOP_STATE_FILE, path / RNG_FILE.format(rank=dist.get_rank())):
            if not needed.exists():
                raise CheckpointError(f"{needed}: missing (megatron actor checkpoint)")
        try:
            loop = torch.load(path / LOOP_STATE_FILE, weights_only=False)
            self._check_same_layout(path, loop, weights_only)
            if not (weights_only or self.te_available):
                ensure_adam_states(self.optimizer)
            state = dist_checkpointing.load(self._sharded_state(True, weights_only), str(ckpt))
            with torch.no_grad():
                self.model[0].module.load_state_dict(state["model"])
            if weights_only:  # an export: no optimizer state, RNG or counters
                return
            # The optimizer copies into main params that require grad (fp32: the model's own).
            _with_peak_lr(state["optimizer"], self.cfg.actor.optim.lr)
            with torch.no_grad():
                self.optimizer.load_state_dict(state["optimizer"])
            rng = torch.load(path / RNG_FILE.format(rank=dist.get_rank()), weights_only=False)
        except CheckpointError:
            raise
        except Exception as err:
            reason = str(err) or type(err).__name__  # megatron's loader raises some errors without a message
            raise CheckpointError(f"{ckpt}: corrupt or incompatible megatron checkpoint: {reason}") from None
        torch.set_rng_state(rng["torch"])
        torch.cuda.set_rng_state(rng["cuda"])
        tracker = tensor_parallel.get_cuda_rng_tracker()
        tracker.set_states(rng_states_like(tracker.get_states(), rng["tracker"]))
        self.optimizer_steps = loop["optimizer_steps"]
        if not self.te_available:
            set_adam_steps(self.optimizer, loop.get("adam_steps", self.optimizer_steps))
        self.skips = SkipCounter(*loop["skips"])
