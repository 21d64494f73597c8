"""benchmarks/partial_rollout_steps.py's bookkeeping on a stand-in engine whose requests decode one
token per tick, all at once (a step lasts as long as its longest request), and which answers an
aborted request with the tokens it made so far."""

import asyncio
import time

from benchmarks.partial_rollout_steps import parse_args, run_steps, summary

TICK = 0.0005  # seconds per decoded token


class TickEngine:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.events: dict[str, asyncio.Event] = {}
        engine = self

        class TokenizerManager:
            def abort_request(self, rid):
                engine.events[rid].set()

        self.tokenizer_manager = TokenizerManager()

    async def async_generate(self, input_ids, sampling_params, return_logprob, rid):
        assert return_logprob and sampling_params["ignore_eos"]
        wanted = sampling_params["max_new_tokens"]
        self.events[rid] = event = asyncio.Event()
        start = time.perf_counter()
        try:
            await asyncio.wait_for(event.wait(), timeout=wanted * TICK)
            made, reason = min(wanted - 1, int((time.perf_counter() - start) / TICK)), "abort"
        except TimeoutError:
            made, reason = wanted, "length"
        entries = [(-1.0, 5, None)] * made
        meta = {"output_token_logprobs": entries, "finish_reason": {"type": reason}}
        return {"output_ids": [5] * made, "meta_info": meta}


def test_partial_steps_train_whole_batches_and_carry_the_oversampled_groups():
    args = parse_args(
        ["--checkpoint", "unused", "--batch", "32", "--group-size", "4", "--oversample-groups", "3",
         "--max-new-tokens", "96", "--prompt-len", "4", "--steps", "4"]
    )  # fmt: skip
    rows = run_steps(TickEngine(), args, vocab=1000)
    for row in rows:
        partial = row["partial"]
        assert partial["trained_responses"] == 32
        assert partial["rollout/carried_groups"] == 3  # in flight: 8 + 3 groups every step
        assert partial["aborted_with_output"] == partial["aborted_requests"]  # this engine always answers
        assert row["plain"]["trained_tokens"] > 0
    assert sum(r["partial"]["aborted_requests"] for r in rows) >= 1
    assert rows[0]["partial"]["rollout/carried_tokens"] == 0
    assert sum(r["partial"]["rollout/carried_tokens"] for r in rows[1:]) > 0
    assert max(r["partial"]["rollout/max_carry_steps"] for r in rows) >= 2
    assert summary(rows)["steady_steps"] == 3
