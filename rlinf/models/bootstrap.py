"""Supervised warm start of the tiny model on worked arithmetic solutions, and its greedy accuracy.

Examples are rendered exactly as the RL loop will see them: the prompt through the chat template
with a generation prompt, then the worked solution and EOS as the response. The loss covers the
response tokens only, so the model learns to answer, not to write prompts.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from rlinf.data.synthetic import ArithmeticProblem
from rlinf.rewards.math_grader import extract_last_boxed, grade

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

IGNORE_INDEX = -100  # label of tokens without a loss (prompt, padding)


@dataclass(frozen=True)
class GreedyEval:
    accuracy: float  # share of problems whose last \boxed{} answer is right
    boxed_fraction: float  # share of responses that contain a complete \boxed{...}
    responses: tuple[str, ...]  # decoded greedy responses, in problem order


def prompt_text(tokenizer: PreTrainedTokenizerBase, problem: ArithmeticProblem) -> str:
    messages = [{"role": "user", "content": problem.record.prompt}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def encode_example(
    tokenizer: PreTrainedTokenizerBase, problem: ArithmeticProblem
) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids); the response ends with EOS like a finished rollout."""
    prompt_ids = tokenizer(prompt_text(tokenizer, problem), add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(problem.worked_solution, add_special_tokens=False)["input_ids"]
    return prompt_ids, [*response_ids, tokenizer.eos_token_id]


def supervised_warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[ArithmeticProblem],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    warmup_steps: int,
    seed: int,
    stop: Callable[[int], bool] | None = None,
    check_every: int = 50,
) -> list[float]:
    """Train `model` in place (on its device) with AdamW for `steps` batches; returns the loss of every step.

    Batches walk through `problems` in a seeded shuffled order, reshuffled each pass. `stop`, when
    given, is asked after every `check_every` steps (with the number of steps done, the model in eval
    mode) and ends the warm start there when it answers true.
    """
    examples = [encode_example(tokenizer, problem) for problem in problems]
    order_rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup_steps))
    model.train()
    losses: list[float] = []
    order: list[int] = []
    progress = tqdm(range(steps), desc="tiny model warm start", unit="step")
    for _ in progress:
        if len(order) < batch_size:
            reshuffled = list(range(len(examples)))
            order_rng.shuffle(reshuffled)
            order += reshuffled
        batch, order = [examples[i] for i in order[:batch_size]], order[batch_size:]
        padded = _right_padded_batch(batch, tokenizer.pad_token_id)
        input_ids, attention_mask, labels = (t.to(model.device) for t in padded)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        progress.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
        if stop is not None and len(losses) % check_every == 0:
            model.eval()
            if stop(len(losses)):
                break
            model.train()
    model.eval()
    return losses


@torch.no_grad()
def greedy_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[ArithmeticProblem],
    *,
    max_new_tokens: int | None = None,
    batch_size: int = 128,
) -> GreedyEval:
    """Greedy-decode every problem (batched, left-padded) and grade the last boxed answer.

    `max_new_tokens` defaults to the longest worked solution of `problems` (with EOS) plus 16: room
    for a wrong answer a little longer than the longest right one.
    """
    if max_new_tokens is None:
        max_new_tokens = max(len(encode_example(tokenizer, problem)[1]) for problem in problems) + 16
    was_training = model.training
    model.eval()
    responses: list[str] = []
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        prompts = [prompt_text(tokenizer, problem) for problem in chunk]
        inputs = tokenizer(
            prompts, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt"
        )
        inputs = inputs.to(model.device)
        output = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        new_tokens = output[:, inputs["input_ids"].shape[1] :]
        responses += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
    model.train(was_training)
    correct = [
        grade(response, problem.record.solutions)
        for response, problem in zip(responses, problems, strict=True)
    ]
    boxed = [extract_last_boxed(response) is not None for response in responses]
    count = max(len(problems), 1)
    return GreedyEval(
        accuracy=sum(correct) / count,
        boxed_fraction=sum(boxed) / count,
        responses=tuple(responses),
    )


def _right_padded_batch(
    batch: Sequence[tuple[list[int], list[int]]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    length = max(len(prompt) + len(response) for prompt, response in batch)
    input_ids = torch.full((len(batch), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), length), dtype=torch.long)
    labels = torch.full((len(batch), length), IGNORE_INDEX, dtype=torch.long)
    for row, (prompt, response) in enumerate(batch):
        end = len(prompt) + len(response)
        input_ids[row, :end] = torch.tensor(prompt + response)
        attention_mask[row, :end] = 1
        labels[row, len(prompt) : end] = torch.tensor(response)
    return input_ids, attention_mask, labels
