"""data.oversample_prompts through the SGLang rollout: one request per response, the unfinished ones
aborted by id once enough groups are complete, and a RolloutBatch of the kept groups alone. The
engine is a stand-in for sglang.Engine (its async_generate / tokenizer_manager.abort_request).
With data.partial_rollout the aborted replies' output is carried and continued next step."""

import asyncio

import pytest

import rlinf.workers.rollout.sglang_engine as sglang_engine
from rlinf.data.datasets import PromptItem
from rlinf.workers.rollout.group_quota import GroupQuota
from rlinf.workers.rollout.sampling import SamplingParams
from rlinf.workers.rollout.sglang_rollout import SGLangRollout

SLOW = 100  # a prompt starting with this token answers only when aborted


class QuotaEngine:
    """Answers prompt [L, ...] with L tokens after L x 5 ms; a SLOW prompt waits for its abort."""

    def __init__(self, **kwargs):
        self.loop = asyncio.new_event_loop()
        self.aborted: list[str] = []
        self.events: dict[str, asyncio.Event] = {}
        engine = self

        class TokenizerManager:
            def auto_create_handle_loop(self):
                pass

            def abort_request(self, rid):
                engine.aborted.append(rid)
                engine.events[rid].set()

        self.tokenizer_manager = TokenizerManager()

    async def async_generate(self, input_ids, sampling_params, return_logprob, rid):
        assert isinstance(rid, str) and return_logprob
        length = input_ids[0]
        self.events[rid] = asyncio.Event()
        if length == SLOW:
            await self.events[rid].wait()
            return {"output_ids": [], "meta_info": {"finish_reason": {"type": "abort"}}}
        await asyncio.sleep(0.005 * length)
        entries = [(-0.5, 7, None)] * length
        return {
            "output_ids": [7] * length,
            "meta_info": {"output_token_logprobs": entries, "finish_reason": {"type": "length"}},
        }


@pytest.fixture
def engine(monkeypatch):
    monkeypatch.setattr(sglang_engine, "import_sglang", lambda: QuotaEngine)
    return sglang_engine.SGLangEngine({}, where="rollout engine (rank 0)")


def test_the_engine_aborts_exactly_the_requests_still_running(engine):
    prompts = [[3, 1], [SLOW, 1], [2, 1], [4, 1], [SLOW, 1], [1, 1]]  # groups of 2: 0 slow, 1, 2 slow
    quota = GroupQuota([row // 2 for row in range(6)], keep=1)
    replies = engine.generate(prompts, [{}] * 6, quota=quota)
    assert quota.kept_rows() == [2, 3]
    aborted = [r["meta_info"]["finish_reason"]["type"] == "abort" for r in replies]
    assert aborted == [False, True, False, False, True, False]
    assert len(engine.engine.aborted) == 2


def test_the_rollout_returns_only_the_kept_groups(engine):
    rollout = object.__new__(SGLangRollout)
    rollout.engine, rollout.routing, rollout.eos_ids, rollout.pad_id = engine, None, [2], 0
    rollout.tokenizer = type(
        "Tok", (), {"decode": lambda self, ids, skip_special_tokens: f"{len(ids)} tokens"}
    )()
    items = [PromptItem((length, 9), f"p{length}", (str(length),), "test") for length in (SLOW, 6, 3, 1)]
    batch = rollout.generate(items, 1, SamplingParams(max_new_tokens=8), seed=0, keep_groups=2)
    # groups (one response each) of lengths 1 and 3 end first: kept in prompt order, renumbered
    assert batch.group_index.tolist() == [0, 1]
    assert batch.solutions == [("3",), ("1",)]
    assert batch.response_mask.sum(1).tolist() == [3, 1]
    assert batch.prompt_ids[:, -2:].tolist() == [[3, 9], [1, 9]]
    assert batch.response_text == ["3 tokens", "1 tokens"]


class PartialEngine(QuotaEngine):
    """data.partial_rollout: a SLOW prompt holds until aborted (while `hold_slow`) and then replies
    with the two tokens it made so far, or with none; other requests answer at once with
    max_new_tokens tokens (or, fresh, L tokens for a prompt [L, 9])."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hold_slow, self.abort_output = True, [8, 8]
        self.requests: list[tuple[list[int], dict]] = []

    async def async_generate(self, input_ids, sampling_params, return_logprob, rid):
        self.requests.append((list(input_ids), dict(sampling_params)))
        self.events[rid] = asyncio.Event()
        if input_ids[0] == SLOW and self.hold_slow:
            await self.events[rid].wait()
            entries = [(-0.25, t, None) for t in self.abort_output]
            meta = {"output_token_logprobs": entries, "finish_reason": {"type": "abort"}}
            return {"output_ids": list(self.abort_output), "meta_info": meta}
        fresh = len(input_ids) == 2 and input_ids[0] != SLOW
        length = input_ids[0] if fresh else sampling_params["max_new_tokens"]
        await asyncio.sleep(0.005 * length)
        entries = [(-0.5, 7, None)] * length
        return {
            "output_ids": [7] * length,
            "meta_info": {"output_token_logprobs": entries, "finish_reason": {"type": "length"}},
        }


@pytest.mark.parametrize("abort_output", [[8, 8], []], ids=["aborted-with-output", "aborted-empty"])
def test_partial_rollout_carries_the_aborted_output_and_continues_it(monkeypatch, abort_output):
    from rlinf.workers.rollout.partial import GroupInFlight

    monkeypatch.setattr(sglang_engine, "import_sglang", lambda: PartialEngine)
    rollout = object.__new__(SGLangRollout)
    rollout.engine = sglang_engine.SGLangEngine({}, where="rollout engine (rank 0)")
    rollout.routing, rollout.eos_ids, rollout.pad_id = None, [2], 0
    rollout.tokenizer = type("Tok", (), {"decode": lambda self, ids, skip_special_tokens: str(ids)})()
    fake = rollout.engine.engine
    fake.abort_output = abort_output
    items = [PromptItem((length, 9), f"p{length}", (str(length),), "test") for length in (SLOW, 2, 3, 4)]
    params = SamplingParams(max_new_tokens=8, min_new_tokens=3)

    first = rollout.generate_partial([GroupInFlight.fresh(item, 1) for item in items[:3]], params, 0, 2)
    assert first.batch.solutions == [("2",), ("3",)]
    (carried,) = first.carried
    assert carried.responses[0].token_ids == tuple(abort_output) and not carried.complete

    fake.hold_slow, fake.requests = False, []
    second = rollout.generate_partial([carried, GroupInFlight.fresh(items[3], 1)], params, 1, 2)
    (input_ids, sampling), _ = fake.requests
    assert input_ids == [SLOW, 9, *abort_output]  # the prompt followed by the tokens so far
    assert sampling["max_new_tokens"] == 8 - len(abort_output)  # the budget left
    assert sampling["min_new_tokens"] == 3 - len(abort_output)
    batch = second.batch
    assert batch.response_ids[0].tolist() == [*abort_output, *[7] * (8 - len(abort_output))]
    assert batch.rollout_logprobs[0].tolist() == [-0.25] * len(abort_output) + [-0.5] * (
        8 - len(abort_output)
    )
    assert batch.finish_reasons == ["length", "length"] and not second.carried
    assert second.carried_tokens == len(abort_output) and second.max_carry_steps == 2
