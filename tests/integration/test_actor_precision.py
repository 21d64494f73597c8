"""bf16 compute keeps fp32 master weights: lr-1e-6 AdamW updates accumulate as in fp32."""

import torch

from rlinf.workers.actor.torch_actor import TorchActor
from tests.integration.conftest import small_config
from tests.integration.test_many_ranks_actor import scored_batch

LR = {"actor.optim.lr": 1e-6}


def trained(cfg, batch, steps: int = 3) -> tuple[TorchActor, list[torch.Tensor]]:
    actor = TorchActor(cfg)
    start = [p.detach().float().clone() for p in actor.master.params]
    for step in range(1, steps + 1):
        actor.train(batch, step, actor.compute_logprobs(batch))
    return actor, start


def test_bf16_updates_at_a_tiny_lr_move_the_weights_as_fp32_does(random_tiny_checkpoint, tmp_path):
    fp32_cfg = small_config(random_tiny_checkpoint, tmp_path, **LR, **{"actor.model.precision": "fp32"})
    bf16_cfg = small_config(random_tiny_checkpoint, tmp_path, **LR, **{"actor.model.precision": "bf16"})
    batch = scored_batch(fp32_cfg)
    fp32, fp32_start = trained(fp32_cfg, batch)
    bf16, bf16_start = trained(bf16_cfg, batch)

    def deltas(actor, start):
        return torch.cat(
            [(p.detach().float() - s).flatten() for p, s in zip(actor.master.params, start, strict=True)]
        )

    d32, d16 = deltas(fp32, fp32_start), deltas(bf16, bf16_start)
    changed32, changed16 = float((d32 != 0).float().mean()), float((d16 != 0).float().mean())
    assert changed32 > 0.9, f"fp32 reference: only {changed32:.1%} of entries moved"
    assert changed16 > 0.9, (
        f"bf16: only {changed16:.1%} of the optimizer's weights moved (updates rounded away)"
    )
    assert 0.7 < float(d16.abs().mean() / d32.abs().mean()) < 1.3
    both = (d32 != 0) & (d16 != 0)
    assert float((d32[both].sign() == d16[both].sign()).float().mean()) > 0.8
    # the bf16 model computes with its fp32 masters, rounded
    for param, master in zip(bf16.master.model_params, bf16.master.params, strict=True):
        assert param.dtype == torch.bfloat16 and torch.equal(param, master.detach().to(torch.bfloat16))
