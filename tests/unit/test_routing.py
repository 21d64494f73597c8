"""Routing record and replay on the HF DeepSeek-V3 gates (rlinf.models.routing) and the embedded
sampler's recording (rlinf.workers.rollout.sampling)."""

import pytest
import torch

from rlinf.models.routing import (
    ExpertRecorder,
    ExpertReplay,
    RoutingReplayError,
    check_replayable,
    moe_gates,
    routing_shape,
)
from rlinf.models.tiny import SMALL_SETTINGS, deepseek_v3_config, random_deepseek_v3
from rlinf.workers.rollout.sampling import SamplingParams, sample

VOCAB = 40


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = random_deepseek_v3(SMALL_SETTINGS, vocab_size=VOCAB, seed=1, initializer_range=0.2)
    return m


def _own_routing(model, input_ids):
    recorder = ExpertRecorder(model)
    with torch.no_grad(), recorder.recording():
        logits = model(input_ids=input_ids, use_cache=False).logits
    return recorder.take().long(), logits


def test_routing_shape_refuses_dense_models_and_too_many_experts():
    config = deepseek_v3_config(SMALL_SETTINGS, vocab_size=VOCAB)
    assert routing_shape(config).num_moe_layers == SMALL_SETTINGS.num_hidden_layers - 1
    dense = deepseek_v3_config(SMALL_SETTINGS, vocab_size=VOCAB, first_k_dense_replace=3)
    with pytest.raises(RoutingReplayError, match="algorithm.routing_replay.mode: the model is dense"):
        routing_shape(dense)
    huge = deepseek_v3_config(SMALL_SETTINGS, vocab_size=VOCAB, n_routed_experts=512)
    with pytest.raises(RoutingReplayError, match="at most 256"):
        routing_shape(huge)
    other = deepseek_v3_config(SMALL_SETTINGS, vocab_size=VOCAB, num_experts_per_tok=4)
    with pytest.raises(RoutingReplayError, match="same architecture"):
        check_replayable(config, other)


def test_replaying_the_routers_own_choice_changes_nothing(model):
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))
    own, logits = _own_routing(model, ids)
    replay = ExpertReplay(model)
    with torch.no_grad(), replay.replaying(own, torch.ones(len(own), dtype=torch.bool), count=True):
        replayed = model(input_ids=ids, use_cache=False).logits
    assert torch.equal(replayed, logits)
    assert replay.pop_counts() == (own.shape[0] * own.shape[1], own.shape[0] * own.shape[1])


def test_replayed_experts_are_used_and_their_router_rows_get_gradients(model):
    """A replayed expert the router's own top-k left out (at every token) still gets a gradient on
    its router row: its weight comes from the full sigmoid scores, not from the post-top-k ones."""
    ids = torch.randint(0, VOCAB, (1, 3), generator=torch.Generator().manual_seed(1))
    own, _ = _own_routing(model, ids)
    layer = 0
    unused = sorted(set(range(SMALL_SETTINGS.n_routed_experts)) - set(own[:, layer].flatten().tolist()))
    assert unused, "need an expert no token routes to"
    drifted = unused[0]
    targets = own.clone()
    targets[:, layer, 0] = drifted  # every token swaps its first expert for one it did not choose
    used: list[torch.Tensor] = []
    experts = [m for m in model.modules() if type(m).__name__ == "DeepseekV3Experts"][layer]
    hook = experts.register_forward_pre_hook(lambda _m, args: used.append(args[1]))
    replay = ExpertReplay(model)
    model.zero_grad()
    try:
        with replay.replaying(targets, torch.ones(len(targets), dtype=torch.bool), count=True):
            logits = model(input_ids=ids, use_cache=False).logits
    finally:
        hook.remove()
    assert torch.equal(used[0], targets[:, layer])
    (logits.float() ** 2).sum().backward()
    gate = moe_gates(model)[layer]
    grad = gate.weight.grad
    assert float(grad[drifted].abs().sum()) > 0, "the replayed expert's router row got no gradient"
    chosen = set(targets[:, layer].flatten().tolist())
    for expert in set(range(SMALL_SETTINGS.n_routed_experts)) - chosen:
        assert float(grad[expert].abs().sum()) == 0.0, f"expert {expert} was not used but got a gradient"
    agreeing, compared = replay.pop_counts()
    assert compared == targets.shape[0] * targets.shape[1]
    assert agreeing == compared - targets.shape[0]  # layer 0 disagrees at every token, the rest agree


def test_unrecorded_tokens_keep_the_routers_choice(model):
    ids = torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(2))
    own, _ = _own_routing(model, ids)
    targets = (own + 1) % SMALL_SETTINGS.n_routed_experts
    recorded = torch.tensor([True, False, True, False])
    used: list[torch.Tensor] = []
    hooks = [
        m.register_forward_pre_hook(lambda _m, args: used.append(args[1]))
        for m in model.modules()
        if type(m).__name__ == "DeepseekV3Experts"
    ]
    try:
        with torch.no_grad(), ExpertReplay(model).replaying(targets, recorded):
            model(input_ids=ids, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    first = used[0]
    assert torch.equal(first[recorded], targets[recorded, 0])
    assert torch.equal(first[~recorded], own[~recorded, 0])


def test_sampling_records_the_experts_a_full_forward_routes_each_token_to(model):
    """The record of incremental decoding (prefill, then one token per step, rows leaving when done,
    several chunks) equals the routing of one teacher-forced forward over each finished row."""
    eos = 3
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [15], [16, 17, 18, 19]]
    out = sample(
        model,
        prompts,
        SamplingParams(temperature=1.0, max_new_tokens=6),
        eos_token_ids=[eos],
        pad_token_id=0,
        generator=torch.Generator().manual_seed(4),
        max_batch_size=2,
        recorder=ExpertRecorder(model),
    )
    assert out.prompt_experts is not None and out.response_experts is not None
    assert out.prompt_experts.shape[:2] == out.prompt_ids.shape
    assert out.response_experts.shape[:2] == out.response_ids.shape
    assert out.prompt_experts.dtype == torch.uint8
    lengths = out.response_mask.sum(1)
    for i, prompt in enumerate(prompts):
        response = out.response_ids[i, : lengths[i]].tolist()
        full, _ = _own_routing(model, torch.tensor([prompt + response]))
        recorded = torch.cat(
            [out.prompt_experts[i][out.prompt_mask[i]], out.response_experts[i, : lengths[i] - 1]]
        ).long()
        fed = full[: len(prompt) + len(response) - 1]
        assert torch.equal(recorded.sort(-1).values, fed.sort(-1).values), f"row {i}"
        assert bool((out.response_experts[i, lengths[i] - 1 :] == 0).all()), "unfed columns stay 0"


def test_a_backend_that_cannot_record_or_replay_is_refused(monkeypatch):
    """Every shipped backend records (rollout) and replays (actor); one outside the lists is refused."""
    from rlinf.config import ConfigError, load_config
    from rlinf.config import validate as validate_module

    replay = ["algorithm.routing_replay.mode=replay"]
    load_config("moonlight-16b-grpo-megatron", replay)  # sglang records, megatron replays
    monkeypatch.setattr(validate_module, "ROUTING_RECORDING_ROLLOUTS", ("torch",))
    with pytest.raises(ConfigError, match="rollout.rollout_backend=sglang cannot"):
        load_config("moonlight-16b-grpo-megatron", replay)
    monkeypatch.setattr(validate_module, "ROUTING_REPLAYING_ACTORS", ("torch",))
    with pytest.raises(ConfigError, match="actor.training_backend=megatron cannot"):
        load_config("moonlight-16b-grpo-megatron", [*replay, "rollout.rollout_backend=torch"])
