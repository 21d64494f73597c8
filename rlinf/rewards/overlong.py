"""DAPO's soft overlong punishment (`reward.overlong_buffer`), added to the reward before advantages.

With L_max = algorithm.sampling_params.max_new_tokens, L_cache = the buffer length and a response
of |y| tokens (EOS included), the penalty is

    0                                       if |y| <= L_max - L_cache
    ((L_max - L_cache) - |y|) / L_cache * f  if L_max - L_cache < |y| <= L_max
    -f                                      if |y| > L_max

(DAPO, Yu et al. 2025, "Soft Overlong Punishment", scaled by the penalty factor f as verl's DAPO
reward manager does).
A response cut at the length limit gets -f; one that ends a token into the buffer gets -f / L_cache.
"""

from __future__ import annotations

from collections.abc import Sequence


def overlong_penalties(
    lengths: Sequence[int], max_length: int, buffer_length: int, penalty_factor: float
) -> list[float]:
    """The penalty (<= 0) of each response length."""
    if not 0 < buffer_length < max_length:
        raise ValueError(f"buffer_length must be in (0, max_length={max_length}), got {buffer_length}")
    expected = max_length - buffer_length
    return [-penalty_factor * min(max(length - expected, 0) / buffer_length, 1.0) for length in lengths]
