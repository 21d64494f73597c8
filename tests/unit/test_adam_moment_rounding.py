"""benchmarks/adam_moment_rounding.py: Adam's second moment stored in bf16 rounded to nearest (TE's
FusedAdam) ratchets up at beta2 = 0.999, so the step size falls against the fp32-state Adam; rounded
stochastically (rlinf's CompactAdamW) it tracks fp32; at beta2 = 0.95 rounding to nearest holds too
(the line rlinf.config.megatron_settings.rounded_moment_problems draws)."""

from benchmarks.adam_moment_rounding import run


def test_a_bf16_second_moment_rounded_to_nearest_shrinks_the_step_at_beta2_0999_only():
    ratchet = run("heavy_tailed", steps=1000, params=20_000, beta2=0.999, seed=0)
    assert ratchet["bf16_nearest"][1000] < 0.93
    assert abs(ratchet["bf16_stochastic"][1000] - 1) < 0.01
    held = run("heavy_tailed", steps=1000, params=20_000, beta2=0.95, seed=0)
    assert abs(held["bf16_nearest"][1000] - 1) < 0.02
