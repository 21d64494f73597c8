"""rlinf.runners.colocation.ColocatedMemory: the colocated transition order, and
actor.offload_between_phases=auto deciding from step 1's memory readings whether later steps keep the
actor resident. A fake GPU books what each side holds; the readings are whole-GPU, like NVML's."""

from types import SimpleNamespace

import pytest

from rlinf.runners.colocation import ColocatedMemory
from rlinf.utils.metrics import PhaseTimer


class FakeGPU:
    def __init__(self, total: float, actor: float, engine: float, base: float = 2.0) -> None:
        self.total, self.actor_size, self.engine_size, self.base = total, actor, engine, base
        self.actor_on, self.engine_on = True, True
        self.calls: list[str] = []

    def used(self) -> float:
        return self.base + self.actor_size * self.actor_on + self.engine_size * self.engine_on


def roles_on(gpu: FakeGPU):
    def call(name, action=None):
        def run(*_args):
            gpu.calls.append(name)
            if action:
                action()

        return run

    actor = SimpleNamespace(
        offload=call("actor.offload", lambda: setattr(gpu, "actor_on", False)),
        onload=call("actor.onload", lambda: setattr(gpu, "actor_on", True)),
        empty_device_cache=call("actor.empty_cache"),
        device_memory_used_gib=gpu.used,
        device_memory_total_gib=lambda: gpu.total,
    )
    rollout = SimpleNamespace(
        sleep=lambda tags=None: (
            gpu.calls.append(f"rollout.sleep{tags or ''}"),
            setattr(gpu, "engine_on", False),
        ),
        wake=lambda tags=None: (gpu.calls.append(f"rollout.wake{tags}"), setattr(gpu, "engine_on", True)),
    )
    return SimpleNamespace(actor=actor, rollout=rollout, colocated=True)


def step(memory: ColocatedMemory, gpu: FakeGPU) -> dict:
    gpu.calls.append("generate")
    memory.before_actor()
    gpu.calls.append("train")
    memory.sync_and_resume(lambda: gpu.calls.append("sync"))
    return memory.pop_metrics()


def run(gpu: FakeGPU, mode, steps: int = 3) -> list[dict]:
    memory = ColocatedMemory(roles_on(gpu), offload_actor=mode, timer=PhaseTimer())
    memory.start()
    return [step(memory, gpu) for _ in range(steps)]


def test_offload_true_keeps_the_documented_order_every_step():
    gpu = FakeGPU(total=140, actor=45, engine=70)
    run(gpu, True, steps=1)
    assert gpu.calls == [
        "actor.offload", "generate", "rollout.sleep", "actor.onload", "train", "actor.empty_cache",
        "rollout.wake['weights']", "sync", "actor.offload", "rollout.wake['kv_cache', 'cuda_graph']",
    ]  # fmt: skip


def test_an_overlapped_run_keeps_both_roles_resident():
    """runner.max_staleness >= 1: the engine generates while the actor trains; nothing is released."""
    gpu = FakeGPU(total=140, actor=45, engine=70)
    memory = ColocatedMemory(roles_on(gpu), offload_actor=False, timer=PhaseTimer(), overlapped=True)
    memory.start()
    step(memory, gpu)
    assert gpu.calls == ["generate", "train", "sync"]


@pytest.mark.parametrize(
    ("actor", "engine", "resident"),
    [
        (45, 70, True),  # 2 + 70 + 45 = 117 <= 133 (95% of 140): later steps keep the actor
        (62, 70, False),  # 134 fits 140 but not with the 5% headroom (133)
        (45, 100, False),  # 147 > 140
    ],
)
def test_auto_offloads_in_step_1_and_then_decides_from_the_readings(actor, engine, resident):
    gpu = FakeGPU(total=140, actor=actor, engine=engine)
    metrics = run(gpu, "auto")
    assert gpu.calls.count("actor.offload") == (2 if resident else 4)  # start + step 1, or every step
    assert metrics[0]["memory/auto_resident_peak_gib"] == pytest.approx(2 + engine + actor)
    assert metrics[0]["actor/offload_between_phases"] == float(not resident)
    assert all("memory/auto_resident_peak_gib" not in m for m in metrics[1:])  # decided once
    # resident: from step 2 the actor stays on the GPU through the rollout (no offload transition)
    assert "memory/actor_offload_gib" in metrics[0]
    assert ["memory/actor_offload_gib" in m for m in metrics[1:]] == [not resident] * 2


def test_auto_without_gpu_readings_keeps_offloading():
    gpu = FakeGPU(total=140, actor=45, engine=70)
    roles = roles_on(gpu)
    roles.actor.device_memory_used_gib = lambda: None
    roles.actor.device_memory_total_gib = lambda: None
    memory = ColocatedMemory(roles, offload_actor="auto", timer=PhaseTimer())
    memory.start()
    for _ in range(2):
        step(memory, gpu)
    assert gpu.calls.count("actor.offload") == 3


@pytest.mark.parametrize("mode", [True, False])
def test_a_checkpoint_of_an_offloaded_actor_gets_the_engines_kv_cache_memory(mode):
    gpu = FakeGPU(total=140, actor=45, engine=70)
    memory = ColocatedMemory(roles_on(gpu), offload_actor=mode, timer=PhaseTimer())
    memory.start()
    step(memory, gpu)
    gpu.calls.clear()
    with memory.around_checkpoint():
        gpu.calls.append("save")
    if mode:  # the engine keeps its weights: no weight sync needed after the save
        assert gpu.calls == [
            "rollout.sleep['kv_cache', 'cuda_graph']",
            "save",
            "rollout.wake['kv_cache', 'cuda_graph']",
        ]
    else:
        assert gpu.calls == ["save"]
    assert memory.pop_metrics() == {}  # not a step transition: nothing leaks into the next step


@pytest.mark.parametrize(
    ("colocated", "offload", "expected"),
    [
        (True, True, [
            "actor.load", "rollout.sleep", "actor.onload", "actor.empty_cache", "rollout.wake['weights']", "sync",
            "actor.offload", "rollout.wake['kv_cache', 'cuda_graph']",
        ]),  # start() does not offload again
        (True, False, [
            "actor.load", "rollout.sleep", "actor.onload", "actor.empty_cache", "rollout.wake['weights']", "sync",
            "rollout.wake['kv_cache', 'cuda_graph']",
        ]),
        (False, True, ["actor.load", "sync"]),  # disaggregated: nothing to release
    ],
)  # fmt: skip
def test_a_resume_syncs_in_the_colocated_order(tmp_path, monkeypatch, colocated, offload, expected):
    """The resumed weights reach the engine the way a step's do: the engine releases its KV cache and
    weights first, instead of the sync running next to a full engine."""
    from rlinf.config import load_config
    from rlinf.runners import checkpointing, grpo_runner
    from rlinf.utils.metrics import MetricLogger

    cfg = load_config(
        "tiny-moe-grpo-cpu",
        [
            f"runner.output_dir={tmp_path / 'results'}",
            "runner.max_steps=3",
            "runner.save_at_end=false",
        ],
    )
    gpu = FakeGPU(total=140, actor=45, engine=70)
    roles = roles_on(gpu)
    roles.colocated = colocated
    roles.actor.load = lambda path: gpu.calls.append("actor.load")
    resumed = checkpointing.ResumePoint(tmp_path, step=3, data_state={"epoch": 0, "index": 0})
    monkeypatch.setattr(checkpointing, "find_resume_point", lambda cfg, loader: resumed)
    monkeypatch.setattr(checkpointing, "sync_weights", lambda roles, bucket_mb: gpu.calls.append("sync"))
    runner = grpo_runner.GRPORunner(cfg, roles, list(range(64)), None, MetricLogger(tmp_path / "logs", ()))
    # what actor.offload_between_phases gives on GPUs (a CPU recipe may not set it)
    runner.memory = ColocatedMemory(roles, offload_actor=offload, timer=runner.timer)
    assert runner.run() is None  # step 3 of 3: resumes, trains nothing
    assert gpu.calls == expected
    assert runner.memory.pop_metrics() == {} and runner.timer.pop() == {}  # nothing leaks into a step
