"""Minibatch early stop (`algorithm.early_stop_imp_ratio`)."""

from __future__ import annotations


def should_early_stop(ratio_mean: float, threshold: float | None) -> bool:
    """True when a minibatch's policy has drifted too far from the one that sampled its data.

    `ratio_mean` is the masked mean importance ratio pi / pi_old over all response tokens of the
    minibatch (the reduced `actor/ratio_mean`). When it exceeds `threshold`, the actor discards
    the minibatch: gradients are zeroed, no optimizer step is taken, and the drop is counted in
    `actor/early_stopped_minibatches`. A threshold of None, 0 or below disables the rule.
    """
    if threshold is None or threshold <= 0:
        return False
    return ratio_mean > threshold
