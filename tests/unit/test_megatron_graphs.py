"""actor.model.cuda_graph_impl / cuda_graph_modules (rlinf.config.megatron_graphs): the provider
fields, the fixed micro-batch shape, the refusals (one line each, naming the key), and the RNG
tracker states a checkpoint carries across the switch. Pure: no megatron needed."""

import re
from pathlib import Path

import pytest
import torch

from rlinf.config import ConfigError, load_config
from rlinf.config.loader import compose_recipe
from rlinf.config.megatron_graphs import TrainShape, fixed_train_shape
from rlinf.config.megatron_settings import MegatronSettingsError, translate
from rlinf.config.schema import ActorConfig
from rlinf.config.typed import from_dict
from rlinf.models.megatron.cuda_graphs import nccl_env_for_graphs, rng_states_like

ROOT = Path(__file__).resolve().parents[2]
MOONLIGHT = str(ROOT / "examples/reasoning/config/math/moonlight-16b-grpo-megatron.yaml")
GRAPHS = "actor.model.cuda_graph_impl=transformer_engine"


def moonlight_actor(*overrides: str) -> ActorConfig:
    return load_config(MOONLIGHT, list(overrides)).actor


def test_graphs_are_off_by_default_and_leave_the_provider_and_the_micro_batches_as_they_were():
    actor = moonlight_actor()
    assert actor.model.cuda_graph_impl == "none"
    provider = translate(actor, te_available=True).provider
    assert not {k for k in provider if "cuda_graph" in k or k == "use_te_rng_tracker"}
    assert fixed_train_shape(actor) is None


def test_the_recipe_key_turns_on_te_graphs_of_attention_router_and_preprocess():
    actor = moonlight_actor(GRAPHS)
    p = translate(actor, te_available=True).provider
    assert p["cuda_graph_impl"] == "transformer_engine"
    assert p["cuda_graph_modules"] == ["attn", "moe_router", "moe_preprocess"]
    assert p["use_te_rng_tracker"] is True and p["cuda_graph_warmup_steps"] == 0
    # a captured dispatch would start the overlapped shared experts on every warm-up pass (H100:
    # megatron's "pre_forward_comm must be called from IDLE state" at the second)
    assert p["moe_shared_expert_overlap"] is False
    assert "moe_shared_expert_overlap" not in translate(moonlight_actor(), te_available=True).provider
    # the recipe's micro-batch: 1 row of seq_length (1024 prompt + 8192 response) tokens
    assert fixed_train_shape(actor) == TrainShape(rows=1, tokens=9216)


@pytest.mark.parametrize(
    ("overrides", "shape"),
    [
        (
            ["actor.micro_batch_size=2", "actor.global_batch_size=64", "actor.seq_length=9220"],
            TrainShape(2, 9224),
        ),
        (
            [
                "actor.pack_sequences=true",
                "actor.max_tokens_per_micro_batch=20001",
                "actor.logprob_micro_batch_size=null",  # the recipe's counts rows
                "actor.model.cuda_graph_modules=[moe_router,moe_preprocess]",
            ],
            TrainShape(1, 20008),
        ),
        (["actor.pack_sequences=true", "actor.model.cuda_graph_modules=[moe_router]"], TrainShape(1, 9216)),
    ],
    ids=["rows", "packed-budget", "packed-rows"],
)
def test_the_fixed_shape_follows_the_micro_batch_keys_rounded_to_the_tensor_parallel_size(overrides, shape):
    """Sequence parallelism splits the tokens over TP = 8 ranks: the length is a multiple of 8."""
    assert fixed_train_shape(moonlight_actor(GRAPHS, *overrides)) == shape


REFUSED = [
    (
        ["actor.model.cuda_graph_modules=[moe]"],
        True,
        "actor.model.cuda_graph_modules: moe graphs the whole MoE layer",
    ),
    (
        ["actor.model.cuda_graph_modules=[attn,mamba]"],
        True,
        "actor.model.cuda_graph_modules: unknown ['mamba']",
    ),
    (
        ["actor.model.cuda_graph_modules=[]"],
        True,
        "actor.model.cuda_graph_modules: empty would graph whole layers",
    ),
    (
        ["actor.model.cuda_graph_modules=[attn,moe_preprocess]"],
        True,
        "actor.model.cuda_graph_modules: moe_preprocess needs moe_router",
    ),
    ([], False, "actor.model.cuda_graph_impl: transformer_engine needs Transformer Engine"),
    (
        ["actor.model.precision=fp32"],
        True,
        "actor.model.cuda_graph_impl: transformer_engine needs actor.model.precision: bf16",
    ),
    (
        ["actor.model.recompute_granularity=full"],
        True,
        "actor.model.cuda_graph_impl: transformer_engine cannot run with actor.model.recompute_granularity: full",
    ),
    (
        ["actor.model.recompute_modules=[core_attn,moe]"],
        True,
        "actor.model.cuda_graph_impl: transformer_engine: actor.model.recompute_modules moe cannot run with the moe_router graph",
    ),
    (
        ["actor.pack_sequences=true"],
        True,
        "actor.model.cuda_graph_modules: attn cannot run with actor.pack_sequences",
    ),
    (
        ["actor.max_tokens_per_micro_batch=16384", "actor.logprob_micro_batch_size=null"],
        True,
        "actor.model.cuda_graph_impl: transformer_engine needs one micro-batch shape; actor.max_tokens_per_micro_batch",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "te", "message"), REFUSED, ids=[m.split(":")[1][:40] for *_, m in REFUSED]
)
def test_what_the_graphs_cannot_run_is_one_line_naming_the_key(overrides, te, message):
    actor = from_dict(ActorConfig, compose_recipe(MOONLIGHT, [GRAPHS, *overrides])["actor"], "actor")
    with pytest.raises(MegatronSettingsError) as error:
        translate(actor, te_available=te)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
    if te:  # the loader refuses it before any worker starts (it assumes TE: workers decide that)
        with pytest.raises(ConfigError, match="^" + re.escape(message)):
            load_config(MOONLIGHT, [GRAPHS, *overrides])


def test_modules_without_graphs_are_refused_instead_of_ignored():
    with pytest.raises(
        ConfigError, match="actor.model.cuda_graph_modules: set, but actor.model.cuda_graph_impl is none"
    ):
        load_config(MOONLIGHT, ["actor.model.cuda_graph_modules=[attn]"])


def test_routing_replay_is_refused_with_graphs():
    with pytest.raises(ConfigError, match="cannot run with algorithm.routing_replay.mode: replay"):
        load_config(MOONLIGHT, [GRAPHS, "algorithm.routing_replay.mode=replay"])


def test_rng_tracker_states_resume_across_the_switch():
    """TE's graph-safe tracker keeps generators, megatron's eager one byte tensors: a checkpoint of
    either kind resumes in a process of the other, with the saved state."""
    saved = torch.Generator().manual_seed(5)
    expected = torch.rand(3, generator=torch.Generator().manual_seed(5))
    mine = torch.Generator().manual_seed(9)
    restored = rng_states_like({"model-parallel-rng": mine}, {"model-parallel-rng": saved.get_state()})
    assert restored["model-parallel-rng"] is mine
    assert torch.equal(torch.rand(3, generator=mine), expected)
    as_bytes = rng_states_like(
        {"model-parallel-rng": torch.Generator().get_state()},
        {"model-parallel-rng": torch.Generator().manual_seed(5)},
    )
    assert torch.equal(as_bytes["model-parallel-rng"], torch.Generator().manual_seed(5).get_state())
    same = torch.Generator().get_state()
    assert rng_states_like({"a": torch.zeros(1)}, {"a": same})["a"] is same
    # generator to generator: in place (captured graphs hold this process's generator objects)
    held = torch.Generator().manual_seed(1)
    kept = rng_states_like({"a": held}, {"a": torch.Generator().manual_seed(5)})
    assert kept["a"] is held and torch.equal(torch.rand(3, generator=held), expected)


def test_nccl_graph_registration_is_off_with_expandable_segments_unless_set():
    """megatron-core's capture asserts NCCL_GRAPH_REGISTER=0 under expandable_segments:True: the
    actor sets it before NCCL starts, and leaves every other environment as it was."""
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}
    nccl_env_for_graphs(env)
    assert env["NCCL_GRAPH_REGISTER"] == "0"
    for env in ({}, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}):
        nccl_env_for_graphs(env)
        assert "NCCL_GRAPH_REGISTER" not in env
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_GRAPH_REGISTER": "1"}
    nccl_env_for_graphs(env)
    assert env["NCCL_GRAPH_REGISTER"] == "1"  # megatron-core then names the problem itself
