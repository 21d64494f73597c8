"""RewardGroup.score over the real RewardWorker: only response texts, their lengths and reference
answers go to the worker, only rewards, verdicts and the timeout count come back, and the batch is filled."""

import pickle

import torch
from test_batch_shard_concat import make_batch

from rlinf.config.schema import Config, RewardConfig
from rlinf.rewards.grader_pool import RewardResult
from rlinf.scheduler.facades import RewardGroup
from rlinf.workers.reward.reward_worker import RewardWorker


class OneWorker:
    """A WorkerGroup stand-in that pickles what crosses, both ways, as Ray would."""

    def __init__(self, worker: RewardWorker) -> None:
        self.worker = worker
        self.sent: list = []
        self.received: list = []

    def call_rank0(self, method: str, *args):
        self.sent.append(pickle.loads(pickle.dumps(args)))
        result = getattr(self.worker, method)(*self.sent[-1])
        self.received.append(pickle.loads(pickle.dumps(result)))
        return self.received[-1]


def test_score_sends_texts_and_answers_and_fills_the_batch():
    batch = make_batch([2, 2, 2], [1, 1, 1], [0, 0, 1])
    batch.response_text[:] = ["\\boxed{4}", "\\boxed{5}", "\\boxed{7}"]
    batch.solutions[:] = [("4",), ("4",), ("7",)]
    batch.extras["rollout/x"] = 1.0
    worker = RewardWorker(Config(reward=RewardConfig(reward_scale=2.0, num_workers=1)))
    try:
        group = OneWorker(worker)
        scored = RewardGroup(group).score(batch)  # type: ignore[arg-type]
    finally:
        worker.close()
    assert group.sent == [(batch.response_text, batch.solutions, [1, 1, 1])]
    assert group.received == [RewardResult(rewards=[2.0, -2.0, 2.0], correct=[True, False, True], timeouts=0)]
    assert torch.equal(scored.rewards, torch.tensor([2.0, -2.0, 2.0]))
    assert torch.equal(scored.correct, torch.tensor([True, False, True]))
    assert scored.extras == {"reward/timeouts": 0.0, "rollout/x": 1.0}
    assert torch.equal(scored.response_ids, batch.response_ids)
