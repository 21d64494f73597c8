"""CompactAdamW: AdamW with bf16 moments (stochastic rounding) against torch.optim.AdamW."""

from __future__ import annotations

import copy

import pytest
import torch

from rlinf.models.megatron.compact_adamw import CompactAdamW, round_to_bf16_stochastically

HYPER = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1}


def test_stochastic_rounding_picks_a_neighbour_with_the_right_odds():
    torch.manual_seed(0)
    step = 2.0**-7  # bf16 spacing in [1, 2)
    x = torch.full((200_000,), 1.0 + step / 8)  # one eighth of the way from 1 to the next bf16 value
    for sign in (1.0, -1.0):
        out = round_to_bf16_stochastically(sign * x).float()
        assert set(out.unique().tolist()) == {sign * 1.0, sign * (1.0 + step)}
        up = (out.abs() > 1.0).float().mean().item()
        assert up == pytest.approx(1 / 8, abs=0.005)
        assert out.mean().item() == pytest.approx(sign * x[0].item(), abs=2e-5)  # unbiased
    exact = torch.tensor([0.0, 1.0, -3.5, 2.0**-100, 65280.0])
    assert torch.equal(round_to_bf16_stochastically(exact).float(), exact)


def _train(optimizer_factory, steps: int, seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    x = torch.randn(256, 16)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    optimizer = optimizer_factory(model.parameters())
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, optimizer, losses


def test_fp32_moments_equal_torch_adamw_bit_for_bit():
    ours, _, our_losses = _train(
        lambda p: CompactAdamW(p, **HYPER, exp_avg_dtype="fp32", exp_avg_sq_dtype="fp32"), 30
    )
    ref, _, ref_losses = _train(lambda p: torch.optim.AdamW(p, **HYPER, foreach=False), 30)
    assert our_losses == ref_losses
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), ref.parameters(), strict=True))


def test_bf16_moments_track_the_fp32_run():
    torch.manual_seed(1)
    _, optimizer, losses = _train(lambda p: CompactAdamW(p, **HYPER), 300, seed=2)
    _, _, ref_losses = _train(lambda p: torch.optim.AdamW(p, **HYPER), 300, seed=2)
    state = next(iter(optimizer.state.values()))
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
    assert losses[-1] < 1e-3 * losses[0]  # it trains to convergence
    # the two loss curves agree to 0.2% of the starting loss at every one of the 300 steps
    assert max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)) < 2e-3 * losses[0]


def test_the_second_moment_decays_in_bf16_where_round_to_nearest_would_freeze_it():
    """One large gradient, then many small ones: the true exp_avg_sq decays by beta2 per step."""
    torch.manual_seed(3)
    beta2 = 0.999
    param = torch.nn.Parameter(torch.zeros(50_000))
    optimizer = CompactAdamW([param], lr=0.0, betas=(0.9, beta2), weight_decay=0.0)
    exact = torch.zeros(()).double()
    nearest = torch.zeros((), dtype=torch.bfloat16)
    for step in range(400):
        g = 1.0 if step == 0 else 1e-4
        param.grad = torch.full_like(param, g)
        optimizer.step()
        exact = beta2 * exact + (1 - beta2) * g * g
        nearest = (beta2 * nearest.float() + (1 - beta2) * g * g).to(torch.bfloat16)
    ours = optimizer.state[param]["exp_avg_sq"].float().mean().item()
    assert exact.item() == pytest.approx(1e-3 * beta2**399, rel=1e-3)
    assert ours == pytest.approx(exact.item(), rel=0.01)
    assert nearest.item() == pytest.approx(1e-3, rel=0.01)  # round-to-nearest never left step 1's value


def test_state_round_trips_through_state_dict_in_its_own_dtypes():
    model, optimizer, _ = _train(lambda p: CompactAdamW(p, **HYPER, exp_avg_sq_dtype="fp32"), 5)
    saved = copy.deepcopy(optimizer.state_dict())
    fresh = CompactAdamW(model.parameters(), **HYPER, exp_avg_sq_dtype="fp32")
    # what torch's loader would do to the moments: cast them to the parameters' dtype (fp32)
    fresh.load_state_dict(saved)
    for key, dtype in (("exp_avg", torch.bfloat16), ("exp_avg_sq", torch.float32)):
        for p in model.parameters():
            assert fresh.state[p][key].dtype == dtype
            assert torch.equal(fresh.state[p][key], optimizer.state[p][key])
    assert all(fresh.state[p]["step"].item() == 5 for p in model.parameters())


def test_init_state_allocates_moments_in_their_storage_dtypes():
    param = torch.nn.Parameter(torch.ones(3, 4))
    optimizer = CompactAdamW([param], exp_avg_dtype="bf16", exp_avg_sq_dtype="fp32")
    optimizer.init_all_states()
    state = optimizer.state[param]
    assert (state["exp_avg"].dtype, state["exp_avg_sq"].dtype) == (torch.bfloat16, torch.float32)
    assert state["exp_avg"].shape == param.shape and not state["exp_avg"].any()
    assert state["step"].item() == 0


def test_refuses_low_precision_master_weights_and_unknown_dtypes():
    with pytest.raises(ValueError, match="fp32 master weights"):
        CompactAdamW([torch.nn.Parameter(torch.ones(2, dtype=torch.bfloat16))])
    with pytest.raises(ValueError, match="fp8"):
        CompactAdamW([torch.nn.Parameter(torch.ones(2))], exp_avg_dtype="fp8")


class _DistributedOptimizerLike:
    """What use_compact_adamw touches on megatron-core's DistributedOptimizer. Like megatron, it
    builds torch AdamW over the model's parameters, then puts its master shards in their place:
    for an fp32 model these are views of the parameters (non-leaf tensors), which torch's
    optimizer constructor would refuse."""

    def __init__(self, params, weight_decay: float, *, shards_are_views: bool = False) -> None:
        groups = [
            {"params": params, "wd_mult": 1.0, "is_expert_parallel": False, "weight_decay": weight_decay}
        ]
        self.optimizer = torch.optim.AdamW(groups, lr=1e-3, betas=(0.8, 0.9), eps=1e-6)
        if shards_are_views:
            self.optimizer.param_groups[0]["params"] = [p.view(-1)[1:] for p in params]
        self.init_state_fn = None


def test_use_compact_adamw_swaps_each_inner_adamw_and_keeps_megatrons_param_groups():
    from rlinf.models.megatron.compact_optimizer import use_compact_adamw

    dense = _DistributedOptimizerLike([torch.nn.Parameter(torch.ones(4))], weight_decay=0.1)
    experts = _DistributedOptimizerLike([torch.nn.Parameter(torch.ones(2, 3))], weight_decay=0.0)
    groups = [dense.optimizer.param_groups[0], experts.optimizer.param_groups[0]]
    chained = type("Chained", (), {"chained_optimizers": [dense, experts]})()
    assert use_compact_adamw(chained, "bf16", "fp32") == 2
    for part, group in zip((dense, experts), groups, strict=True):
        assert isinstance(part.optimizer, CompactAdamW)
        (kept,) = part.optimizer.param_groups
        assert kept is group and kept["wd_mult"] == 1.0 and not kept["is_expert_parallel"]
        assert (kept["lr"], kept["betas"], kept["eps"]) == (1e-3, (0.8, 0.9), 1e-6)
        part.init_state_fn(part.optimizer, None)  # what megatron runs before loading a checkpoint
        state = part.optimizer.state[kept["params"][0]]
        assert (state["exp_avg"].dtype, state["exp_avg_sq"].dtype) == (torch.bfloat16, torch.float32)
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    with pytest.raises(RuntimeError, match="fresh torch AdamW, found CompactAdamW"):
        use_compact_adamw(dense, "bf16", "bf16")


def test_use_compact_adamw_takes_fp32_master_shards_that_are_views_of_the_model_params():
    """An fp32 model (megatron's fp32 path): the shards are non-leaf views, updated in place."""
    from rlinf.models.megatron.compact_optimizer import use_compact_adamw

    param = torch.nn.Parameter(torch.arange(5.0))
    part = _DistributedOptimizerLike([param], weight_decay=0.0, shards_are_views=True)
    (shard,) = part.optimizer.param_groups[0]["params"]
    assert not shard.is_leaf
    assert use_compact_adamw(part, "bf16", "bf16") == 1
    assert part.optimizer.param_groups[0]["params"][0] is shard
    shard.grad = torch.ones(4)
    part.optimizer.step()
    with torch.no_grad():
        assert param[0] == 0.0 and torch.all(param[1:] < torch.arange(1.0, 5.0))  # only the shard moved
    with pytest.raises(ValueError, match="fp32 master weights"):
        half = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
        use_compact_adamw(_DistributedOptimizerLike([half], 0.0), "bf16", "bf16")


def test_a_step_tensor_shared_by_all_parameters_counts_once_per_step():
    """megatron-core's distributed optimizer loads a checkpoint by giving every parameter's state
    one shared `step` tensor; each parameter's bias correction must still see the same count."""
    model, optimizer, _ = _train(
        lambda p: CompactAdamW(p, **HYPER, exp_avg_dtype="fp32", exp_avg_sq_dtype="fp32"), 3
    )
    reference = copy.deepcopy((model, optimizer))
    shared = torch.tensor(3.0)
    for state in optimizer.state.values():
        state["step"] = shared
    for m, opt in ((model, optimizer), reference):
        for p in m.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference[0].parameters(), strict=True))
    assert {s["step"].item() for s in optimizer.state.values()} == {4.0}
