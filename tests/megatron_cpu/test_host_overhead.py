"""The Megatron actor's GPU-bound train and logprob calls, on the CPU (fp32, one gloo rank):

- the LM head on the response rows only equals GPTModel's full-vocabulary output layer followed by
  picking the response rows (logprobs, entropy, every gradient), padded and packed THD (TP = 2 with
  sequence parallelism: test_host_overhead_many_ranks.py);
- the optimizer step takes the grad norm once, clips only when the coefficient is below 1, and
  lands on exactly the weights of megatron's own `optimizer.step()`;
- a minibatch reaches the device in one copy, with the same values as the unstaged inputs.
"""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pytest
import torch

REASON = "needs megatron-core 0.19 and megatron-bridge 0.6 (bash requirements/install.sh megatron-cpu)"
pytest.importorskip("megatron.core", reason=REASON)
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip(REASON, allow_module_level=True)

from actor_on_cpu import VOCAB, build_actor, masters, tokens, varied_batch  # noqa: E402
from full_vocab import largest_differences  # noqa: E402


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_response_rows_lm_head_equals_the_full_vocabulary_head(on_cpu, tiny_megatron_checkpoint, packed):
    actor = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32", pack_sequences=packed)
    actor.cfg.algorithm.sampling_params.__dict__["temperature"] = 0.7  # a frozen dataclass
    diffs = largest_differences(actor, varied_batch())
    assert diffs["nonzero_grads"] > 10
    assert diffs["logprobs"] <= 1e-5 and diffs["entropy"] <= 1e-5 and diffs["masked_zero"] == 0
    assert diffs["grads"] <= 1e-5, diffs


def _grads(actor, seed: int) -> None:
    """Next-token cross-entropy gradients of a fixed batch in the actor's grad buffers."""
    model = actor.model[0]
    actor.zero_grad()
    batch = tokens(seed)
    positions = torch.arange(batch.shape[1]).expand_as(batch)
    logits = model(input_ids=batch[:, :-1], position_ids=positions[:, :-1], attention_mask=None)
    torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), batch[:, 1:].reshape(-1)).backward()
    model.finish_grad_sync()


def _counting(patch, module, name: str) -> list:
    calls: list = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    patch.setattr(module, name, counted)
    return calls


def test_one_grad_norm_a_clip_only_when_it_clips_and_megatrons_own_result(on_cpu, tiny_megatron_checkpoint):
    from megatron.core.optimizer import clip_grads, optimizer

    ours = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32")
    megatrons = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32")
    unclipped = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32")
    for step, max_norm in enumerate((1e9, 1e-3)):  # the coefficient: clamped to 1, then far below
        for actor in (ours, megatrons, unclipped):
            _grads(actor, step)
        with pytest.MonkeyPatch.context() as patch:
            norms = _counting(patch, optimizer, "get_grad_norm_fp32")
            clips = _counting(patch, clip_grads, "clip_grad_by_total_norm_fp32")
            norm = ours.clip_grad_norm(max_norm)
            ours.optimizer_step()
        assert len(norms) == 1, f"the grad norm was taken {len(norms)} times"
        assert (len(clips) > 0) == (max_norm < norm), (max_norm, norm, clips)
        # megatron's own path: prepare, norm, clip by the optimizer's clip_grad, step
        for part in getattr(megatrons.optimizer, "chained_optimizers", [megatrons.optimizer]):
            part.config.clip_grad = max_norm
        for group in megatrons.optimizer.param_groups:
            group["lr"] = ours.optimizer.param_groups[0]["lr"]
        updated, megatron_norm, _ = megatrons.optimizer.step()
        assert updated and float(megatron_norm) == norm
        unclipped.clip_grad_norm(1e9)
        unclipped.optimizer_step()
        for got, want in zip(masters(ours), masters(megatrons), strict=True):
            assert torch.equal(got, want)
        moved = any(not torch.equal(a, b) for a, b in zip(masters(ours), masters(unclipped), strict=True))
        assert moved == (max_norm < norm), "clipping changed nothing, or changed an unclipped step"


def test_a_minibatch_reaches_the_device_in_one_copy_with_the_unstaged_values(
    on_cpu, tiny_megatron_checkpoint
):
    from rlinf.workers.actor import megatron_forward

    actor = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32")
    batch = varied_batch()
    batch.old_logprobs = torch.randn(batch.response_ids.shape)
    micros = [batch.select([0, 1, 2]).trimmed(), batch.select([3, 4, 5]).trimmed()]
    with pytest.MonkeyPatch.context() as patch:
        copies = _counting(patch, megatron_forward, "to_device_once")
        staged = actor._stage(micros, loss_fields=True)
    assert len(copies) == 1
    model = actor.model[0]
    for micro, (on_device, inputs) in zip(micros, staged, strict=True):
        unstaged = actor._host_inputs(micro)
        for name in ("tokens", "positions", "rows", "targets", "slots", "mask"):
            assert torch.equal(getattr(inputs, name), getattr(unstaged, name)), name
        for name in ("response_mask", "old_logprobs", "advantages", "rollout_logprobs"):
            assert torch.equal(getattr(on_device, name), getattr(micro, name)), name
        with torch.no_grad():
            assert torch.equal(actor._forward(model, inputs)[0], actor._forward(model, unstaged)[0])


def _staged_storages(patch, module) -> tuple[list, set]:
    """Counts `module.to_device_once` calls and collects the storages its results live in."""
    calls: list = []
    storages: set = set()
    original = module.to_device_once

    def staging(*args, **kwargs):
        calls.append(1)
        out = original(*args, **kwargs)
        storages.update(t.untyped_storage().data_ptr() for t in out if t is not None)
        return out

    patch.setattr(module, "to_device_once", staging)
    return calls, storages


def _names_a_device(args, kwargs) -> bool:
    return "device" in kwargs or any(isinstance(a, (str, torch.device, torch.Tensor)) for a in args)


def test_a_train_step_moves_nothing_to_the_device_outside_the_staging(on_cpu, tiny_megatron_checkpoint):
    """One copy per minibatch, and the actor's code (forward, loss, update loop) moves no other
    tensor to the device while training: its remaining `.to(device)` calls (the loss's) meet
    tensors already there. megatron-core's own calls are not counted."""
    from dataclasses import replace

    from rlinf.workers.actor import megatron_forward
    from rlinf.workers.actor.policy_update import DPInfo, SkipCounter, UpdateSettings, run_policy_update

    actor = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32")
    actor.dp = DPInfo()
    settings = replace(UpdateSettings.from_config(actor.cfg), micro_batch_size=2, global_batch_size=6)
    batch = varied_batch()
    batch.old_logprobs = torch.zeros(batch.response_ids.shape)
    ours = {
        str(Path(inspect.getfile(f)).resolve()) for f in (megatron_forward, type(actor), run_policy_update)
    }
    moves: list[str] = []
    to = torch.Tensor.to

    with pytest.MonkeyPatch.context() as patch:
        copies, staged = _staged_storages(patch, megatron_forward)

        def watched(self, *args, **kwargs):
            caller = inspect.currentframe().f_back  # type: ignore[union-attr]
            if (
                caller is not None
                and str(Path(caller.f_code.co_filename).resolve()) in ours
                and _names_a_device(args, kwargs)
                and self.untyped_storage().data_ptr() not in staged
            ):
                moves.append(f"{caller.f_code.co_name}:{caller.f_lineno}")
            return to(self, *args, **kwargs)

        patch.setattr(torch.Tensor, "to", watched)
        metrics = run_policy_update(actor, batch, settings, step=1, skips=SkipCounter())
    assert len(copies) == 1, "one minibatch, one copy"
    assert moves == [], moves
    assert metrics["actor/skipped_steps"] == 0 and metrics["actor/grad_norm"] > 0
