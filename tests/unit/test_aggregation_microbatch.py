import pytest
import torch

from rlinf.algorithms import (
    LOSS_AGGREGATIONS,
    LossNormalizer,
    aggregate,
    compute_policy_loss,
    reduce_metrics,
)
from rlinf.config.schema import AlgorithmConfig, RolloutISConfig

NAN = float("nan")
VALUES = torch.tensor([[1.0, 2.0, 3.0, NAN], [4.0, NAN, float("inf"), NAN]], dtype=torch.float64)
MASK = torch.tensor([[True, True, True, False], [True, False, False, False]])
AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]


@pytest.mark.parametrize(
    ("agg", "expected"),
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),
        ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + 4 / 1) / 2),
        ("seq-mean-token-sum", ((1 + 2 + 3) + 4) / 2),
    ],
)
def test_aggregations_by_hand_ignore_padding(agg: str, expected: float) -> None:
    normalizer = LossNormalizer.from_masks([MASK])
    assert aggregate(VALUES, MASK, agg, normalizer).item() == pytest.approx(expected)


def test_normalizer_counts_tokens_and_nonempty_sequences_over_all_micro_batches() -> None:
    empty_row = torch.zeros(1, 4, dtype=torch.bool)
    normalizer = LossNormalizer.from_masks([MASK, torch.cat([MASK, empty_row])])
    assert normalizer == LossNormalizer(num_tokens=8.0, num_sequences=4.0)


def test_normalizer_without_tokens_is_rejected() -> None:
    with pytest.raises(ValueError, match="num_tokens=0"):
        LossNormalizer.from_masks([torch.zeros(2, 3, dtype=torch.bool)])


def test_unknown_aggregation_names_the_valid_ones() -> None:
    assert LOSS_AGGREGATIONS.names() == tuple(sorted(AGGREGATIONS))
    with pytest.raises(ValueError, match="'seq-sum'.*seq-mean-token-mean, seq-mean-token-sum, token-mean"):
        aggregate(VALUES, MASK, "seq-sum", LossNormalizer(1.0, 1.0))


def test_reduce_metrics_sums_contributions_and_takes_max_of_maxima() -> None:
    reduced = reduce_metrics(
        [
            {"actor/policy_loss": torch.tensor(0.25), "actor/ratio_max": torch.tensor(3.0)},
            {"actor/policy_loss": 0.5, "actor/ratio_max": 7.0, "actor/entropy": 1.5},
            {"actor/policy_loss": -0.125, "actor/ratio_max": 2.0},
        ]
    )
    assert reduced == {"actor/policy_loss": 0.625, "actor/ratio_max": 7.0, "actor/entropy": 1.5}


# --- micro-batch invariance -------------------------------------------------------------------
# A minibatch of 8 sequences of varying length whose logprobs depend on a parameter `theta`, so the
# gradient w.r.t. theta exercises every term of the loss (clipping, dual clip, KL, entropy, TIS).

NUM_SEQUENCES, MAX_LEN, FEATURES = 8, 7, 3
LENGTHS = torch.tensor([1, 7, 3, 5, 2, 6, 4, 7])


def make_minibatch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    mask = torch.arange(MAX_LEN) < LENGTHS[:, None]
    base = -1.0 - randn(NUM_SEQUENCES, MAX_LEN).abs()
    return {
        "mask": mask,
        "base": base,
        "features": randn(NUM_SEQUENCES, MAX_LEN, FEATURES),
        "old_logprobs": base + 0.3 * randn(NUM_SEQUENCES, MAX_LEN),
        "rollout_logprobs": base + 0.3 * randn(NUM_SEQUENCES, MAX_LEN),
        "ref_logprobs": base + 0.3 * randn(NUM_SEQUENCES, MAX_LEN),
        "advantages": randn(NUM_SEQUENCES),
        "entropy_scale": randn(NUM_SEQUENCES, MAX_LEN).abs(),
    }


def full_config(agg: str) -> AlgorithmConfig:
    return AlgorithmConfig(
        loss_agg_func=agg,
        clip_ratio_high=0.28,
        clip_ratio_c=1.5,
        kl_beta=0.05,
        kl_penalty_type="k3",
        entropy_bonus=0.01,
        rollout_is=RolloutISConfig(mode="token_tis", clip=1.2),
    )


def gradient_over_micro_batches(
    cfg: AlgorithmConfig, num_micro_batches: int, *, naive_local_mean: bool = False
) -> tuple[torch.Tensor, dict[str, float]]:
    """Gradient w.r.t. theta and reduced metrics after one backward per micro-batch.

    naive_local_mean: normalise each micro-batch by its own counts and average the micro-batch
    losses, the mistake the global normaliser exists to avoid.
    """
    data = make_minibatch()
    theta = torch.tensor([0.2, -0.1, 0.15], dtype=torch.float64, requires_grad=True)
    rows = torch.arange(NUM_SEQUENCES).chunk(num_micro_batches)
    global_normalizer = LossNormalizer.from_masks([data["mask"][r] for r in rows])
    metrics = []
    for r in rows:
        mask = data["mask"][r]
        logprobs = data["base"][r] + data["features"][r] @ theta
        normalizer = LossNormalizer.from_masks([mask]) if naive_local_mean else global_normalizer
        output = compute_policy_loss(
            cfg,
            logprobs=logprobs,
            old_logprobs=data["old_logprobs"][r],
            advantages=data["advantages"][r],
            response_mask=mask,
            normalizer=normalizer,
            rollout_logprobs=data["rollout_logprobs"][r],
            ref_logprobs=data["ref_logprobs"][r],
            entropy=data["entropy_scale"][r] * (1 + theta.sum()),
        )
        scale = 1 / num_micro_batches if naive_local_mean else 1.0
        (output.loss * scale).backward()
        metrics.append(output.metrics)
    assert theta.grad is not None
    return theta.grad, reduce_metrics(metrics)


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_gradient_does_not_depend_on_the_micro_batch_split(agg: str) -> None:
    cfg = full_config(agg)
    whole, _ = gradient_over_micro_batches(cfg, 1)
    assert whole.abs().sum() > 1e-3  # a trivially zero gradient would prove nothing
    for num_micro_batches in (2, 3, 4):  # 3 gives uneven micro-batches of 3, 3 and 2 sequences
        split, _ = gradient_over_micro_batches(cfg, num_micro_batches)
        assert torch.allclose(split, whole, rtol=0, atol=1e-7)


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_naive_per_micro_batch_mean_changes_the_gradient(agg: str) -> None:
    # Uneven micro-batches (3, 3, 2 sequences): even sequence counts would hide the error of the
    # seq-mean variants, whose naive mean of means is only right when every micro-batch is the same size.
    cfg = full_config(agg)
    whole, _ = gradient_over_micro_batches(cfg, 1)
    naive, _ = gradient_over_micro_batches(cfg, 3, naive_local_mean=True)
    assert not torch.allclose(naive, whole, rtol=0, atol=1e-4)


def test_reduced_metrics_do_not_depend_on_the_micro_batch_split() -> None:
    cfg = full_config("seq-mean-token-mean")
    _, whole = gradient_over_micro_batches(cfg, 1)
    _, split = gradient_over_micro_batches(cfg, 4)
    assert set(split) == set(whole)
    for name, value in whole.items():
        assert split[name] == pytest.approx(value, abs=1e-12), name
    # the data really exercise every clip, so their metrics are tested for split-invariance too
    for name in ("clip_fraction_low", "clip_fraction_high", "dual_clip_fraction", "tis_clip_fraction"):
        assert 0 < whole[f"actor/{name}"] < 1
    assert whole["actor/ratio_max"] > 1


def test_data_parallel_mean_times_dp_size_equals_the_single_process_gradient() -> None:
    # Two DP ranks of two micro-batches each: DDP averages the rank gradients, the actor scales
    # the loss by dp_size, and the result must equal processing the minibatch in one piece.
    cfg = full_config("token-mean")
    whole, _ = gradient_over_micro_batches(cfg, 1)
    data = make_minibatch()
    rank_rows = torch.arange(NUM_SEQUENCES).chunk(2)
    global_normalizer = LossNormalizer.from_masks([data["mask"]])  # the all-reduced counts
    rank_gradients = []
    for rows in rank_rows:
        theta = torch.tensor([0.2, -0.1, 0.15], dtype=torch.float64, requires_grad=True)
        for r in rows.chunk(2):
            output = compute_policy_loss(
                cfg,
                logprobs=data["base"][r] + data["features"][r] @ theta,
                old_logprobs=data["old_logprobs"][r],
                advantages=data["advantages"][r],
                response_mask=data["mask"][r],
                normalizer=global_normalizer,
                rollout_logprobs=data["rollout_logprobs"][r],
                ref_logprobs=data["ref_logprobs"][r],
                entropy=data["entropy_scale"][r] * (1 + theta.sum()),
            )
            (output.loss * len(rank_rows)).backward()
        assert theta.grad is not None
        rank_gradients.append(theta.grad)
    ddp_average = torch.stack(rank_gradients).mean(0)
    assert torch.allclose(ddp_average, whole, rtol=0, atol=1e-7)
