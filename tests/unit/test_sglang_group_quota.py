"""data.oversample_prompts through the SGLang rollout: one request per response, the unfinished ones
aborted by id once enough groups are complete, and a RolloutBatch of the kept groups alone. The
engine is a stand-in for sglang.Engine (its async_generate / tokenizer_manager.abort_request)."""

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
