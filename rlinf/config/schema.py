"""Typed recipe schema. Imports nothing heavy: config tooling and `--help` stay fast.

Every field carries a one-line comment (`# doc:`) that docs/configuration.md is generated from;
a unit test keeps that page in step with this file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Precision = Literal["fp32", "bf16", "fp16"]
LRDecayStyle = Literal["constant", "warmup_constant", "cosine"]


@dataclass(frozen=True)
class ClusterConfig:
    num_nodes: int = 1  # doc: nodes in the Ray cluster
    num_gpus_per_node: int | None = None  # doc: GPUs per node; null = detect (0 on a CPU machine)
    # doc: role(s) -> "all", a GPU range "0-3", or a list "0,2"; roles joined by commas share GPUs
    component_placement: dict[str, str] = field(default_factory=lambda: {"actor,rollout,reward": "all"})
    # doc: start a CUDA MPS daemon for the run, so that processes sharing a GPU (a resident actor and rollout engine) run their kernels at once instead of in turns; one node, a Ray cluster the run starts (docs/rollout.md)
    cuda_mps: bool = False


@dataclass(frozen=True)
class WandbConfig:
    project: str = "rlinf"  # doc: the wandb project the run logs to
    name: str | None = None  # doc: the wandb run's name; null = runner.experiment_name
    tags: tuple[str, ...] = ()  # doc: the wandb run's tags


@dataclass(frozen=True)
class LoggerConfig:
    log_path: str | None = None  # doc: TensorBoard / resolved-config dir; null = ./logs/<experiment_name>
    # doc: metric sinks: tensorboard, wandb (the wandb extra: bash requirements/install.sh embedded --wandb); the console line and metrics.jsonl are always written
    logger_backends: tuple[str, ...] = ("tensorboard",)
    wandb: WandbConfig = field(default_factory=WandbConfig)  # doc: the wandb run (logger_backends with wandb)
    plot: bool = True  # doc: save a PNG of reward and validation accuracy per step next to the logs


@dataclass(frozen=True)
class RunnerConfig:
    experiment_name: str = "grpo"  # doc: names the log and checkpoint folders
    output_dir: str = "./results"  # doc: checkpoints go to <output_dir>/<experiment_name>/checkpoints
    logger: LoggerConfig = field(default_factory=LoggerConfig)  # doc: metric logging
    seed: int = 1234  # doc: global seed (data order, sampling, init)
    max_epochs: int = 1  # doc: passes over the training set
    max_steps: int = -1  # doc: stop after this many GRPO steps; -1 = bounded by max_epochs only
    val_check_interval: int = 0  # doc: validate every N steps (and before step 1 and at the end); 0 = never
    save_interval: int = 0  # doc: checkpoint every N steps (and at the end); 0 = only at the end
    save_at_end: bool = True  # doc: checkpoint after the last step (and on a stop signal); false for throwaway runs such as benchmarks
    keep_checkpoints: int = 2  # doc: keep the last K checkpoints
    export_hf_interval: int = 0  # doc: also write the actor's weights as a Hugging Face folder (config, tokenizer) to <output_dir>/<experiment_name>/hf/step_<N> every N steps and after the last step; none is pruned; 0 = never
    resume_dir: str | None = None  # doc: "auto" (latest of this experiment), a checkpoint path, or null
    max_consecutive_skips: int = 3  # doc: abort after this many non-finite optimizer steps in a row
    max_staleness: int = 0  # doc: policy versions a trained sample may lag the actor; the rollout generates up to this many steps ahead while the actor trains (docs/rollout.md, "Overlapping rollout and training"); 0 = the synchronous loop
    # doc: a batch older than runner.max_staleness when its step comes: generated again with the current weights, or dropped for the next batch
    stale_samples: Literal["regenerate", "drop"] = "regenerate"


@dataclass(frozen=True)
class RolloutISConfig:
    mode: Literal["none", "token_tis"] = "none"  # doc: rollout/trainer mismatch correction
    clip: float = 2.0  # doc: token_tis weight cap: min(exp(logp_actor - logp_rollout), clip)


@dataclass(frozen=True)
class RoutingReplayConfig:
    # doc: MoE rollout routing replay (docs/routing_replay.md). none; measure: the rollout records every token's experts and the logprob recompute reports routing/agreement; replay: the actor's routers also take the recorded experts, in the recompute and in training (weights from the full router scores, so gradients reach the replayed experts)
    mode: Literal["none", "measure", "replay"] = "none"


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0  # doc: sampling temperature (logprobs are of the tempered distribution)
    top_p: float = 1.0  # doc: nucleus sampling mass
    top_k: int = -1  # doc: keep the k most likely tokens; -1 = all
    max_new_tokens: int = 512  # doc: response length cap
    min_new_tokens: int = 0  # doc: EOS is masked until this many tokens are generated


@dataclass(frozen=True)
class DynamicSamplingConfig:
    # doc: DAPO dynamic sampling: drop the groups whose `metric` is equal for every response (zero advantage) and generate on more prompts until data.rollout_batch_size groups remain (docs/rollout.md)
    enable: bool = False
    # doc: what must vary within a group to keep it: reward (the reward advantages are computed from, overlong shaping included) or accuracy (the grader's verdict)
    metric: Literal["reward", "accuracy"] = "reward"
    # doc: generation rounds per step at most, the first included; a step that reaches it short of groups trains with zero-advantage groups making up the batch (dynamic_sampling/cap_hit)
    max_gen_rounds: int = 4


@dataclass(frozen=True)
class AlgorithmConfig:
    adv_type: str = "grpo"  # doc: advantage estimator: grpo, dr_grpo, rloo
    group_size: int = 8  # doc: responses sampled per prompt
    normalize_advantages: bool = False  # doc: whiten advantages over the whole batch
    loss_type: str = "actor"  # doc: policy loss: actor (PPO clipped surrogate)
    loss_agg_func: str = "token-mean"  # doc: token-mean, seq-mean-token-mean, seq-mean-token-sum
    ratio_clip_eps: float = 0.2  # doc: lower clip: ratio >= 1 - ratio_clip_eps
    clip_ratio_high: float = 0.2  # doc: upper clip: ratio <= 1 + clip_ratio_high
    clip_ratio_c: float | None = None  # doc: dual-clip bound for negative advantages (> 1); null = off
    kl_beta: float = 0.0  # doc: KL-to-reference coefficient; 0 skips the reference model entirely
    kl_penalty_type: str = "low_var_kl"  # doc: k1, k2, k3, low_var_kl
    entropy_bonus: float = 0.0  # doc: entropy coefficient subtracted from the loss
    early_stop_imp_ratio: float | None = None  # doc: drop a minibatch whose mean pi/pi_old exceeds this
    rollout_is: RolloutISConfig = field(default_factory=RolloutISConfig)  # doc: mismatch correction
    # doc: false: the rollout's own logprobs serve as pi_old and the actor's logprob recompute is skipped (docs/rollout.md); refused with algorithm.rollout_is or kl_beta > 0, which need the actor's forward; rollout/logprob_abs_diff is then not reported
    recompute_logprobs: bool = True
    routing_replay: RoutingReplayConfig = field(
        default_factory=RoutingReplayConfig
    )  # doc: MoE routing replay
    sampling_params: SamplingConfig = field(default_factory=SamplingConfig)  # doc: rollout sampling
    val_n: int = 1  # doc: samples per validation problem (mean@k, pass@k); greedy pass@1 always
    dynamic_sampling: DynamicSamplingConfig = field(
        default_factory=DynamicSamplingConfig
    )  # doc: DAPO dynamic sampling


@dataclass(frozen=True)
class SyntheticDataConfig:
    digits: int = 1  # doc: max digits of each operand
    operations: tuple[str, ...] = ("+", "-")  # doc: operators drawn from + - *
    steps: int = 2  # doc: operations per problem
    num_train: int = 3000  # doc: training problems
    num_val: int = 128  # doc: validation problems (disjoint from training)


@dataclass(frozen=True)
class DataConfig:
    type: Literal["math", "synthetic"] = "math"  # doc: math = files; synthetic = generated arithmetic
    train_data_paths: tuple[str, ...] = ()  # doc: jsonl / json / parquet files for training
    val_data_paths: tuple[str, ...] = ()  # doc: files for validation
    prompt_key: str = "prompt"  # doc: record field holding the prompt (string or chat messages)
    answer_key: str = "solutions"  # doc: record field holding the answer(s)
    apply_chat_template: bool = False  # doc: render prompts with the tokenizer's chat template
    max_prompt_length: int = 1024  # doc: longer prompts are dropped (counted, with a warning)
    rollout_batch_size: int = 8  # doc: prompts per GRPO step (responses = this x group_size)
    oversample_prompts: int = 0  # doc: extra prompts drawn per step; the rollout ends once rollout_batch_size of the step's groups have every response finished, and drops the rest or carries them (partial_rollout) (cuts the step's long-response tail; favours prompts whose responses end sooner; docs/rollout.md)
    partial_rollout: bool = False  # doc: with oversample_prompts > 0, carry the groups not complete at the quota into the next step (their unfinished responses continue there) instead of dropping them; carried responses mix tokens from several policy versions (docs/rollout.md)
    val_batch_size: int | None = None  # doc: prompts per validation generate call; null = all at once
    shuffle: bool = True  # doc: reshuffle the training set each epoch (seeded)
    skip_invalid: bool = False  # doc: skip and count bad records instead of failing
    synthetic: SyntheticDataConfig = field(default_factory=SyntheticDataConfig)  # doc: generator knobs


@dataclass(frozen=True)
class ModelConfig:
    model_path: str = ""  # doc: HF checkpoint dir, or tiny://bootstrap for the built tiny model
    model_type: str = "deepseek_v3"  # doc: architecture family (deepseek_v3)
    precision: Precision = "bf16"  # doc: parameter / compute dtype
    trust_remote_code: bool = False  # doc: allow the checkpoint's own tokenizer code (Moonlight needs it)
    tensor_model_parallel_size: int = 1  # doc: megatron TP
    pipeline_model_parallel_size: int = 1  # doc: megatron PP
    expert_model_parallel_size: int = 1  # doc: megatron EP
    expert_tensor_parallel_size: int = 1  # doc: megatron ETP
    context_parallel_size: int = 1  # doc: megatron CP
    sequence_parallel: bool = False  # doc: megatron sequence parallel (required for MoE with TP > 1)
    multi_latent_attention: bool = True  # doc: MLA (DeepSeek-V3)
    moe_token_dispatcher_type: str = "alltoall"  # doc: megatron MoE dispatcher
    recompute_granularity: str | None = None  # doc: megatron activation recompute: null, selective, full
    recompute_modules: tuple[str, ...] = ()  # doc: modules recomputed with selective granularity
    moe_router_bias_update_rate: float = 0.0  # doc: 0 freezes the routing bias during RL
    # doc: without Transformer Engine: routed experts as grouped GEMMs (rlinf's module) instead of megatron's per-expert loop (off by default; the Moonlight recipe turns it on; with TE grouped GEMMs always run: TEGroupedMLP, or rlinf's with moe_grouped_gemm_impl: torch)
    moe_grouped_gemm: bool = False
    # doc: which grouped GEMM computes the routed experts: auto = Transformer Engine's GroupedLinear (TEGroupedMLP) where TE is installed, else rlinf's torch grouped_mm experts when moe_grouped_gemm is true; transformer_engine = TE's (refused without TE); torch = rlinf's torch grouped_mm experts (one launch per projection, weights read in place from DDP's buffer) in either spec
    moe_grouped_gemm_impl: Literal["auto", "transformer_engine", "torch"] = "auto"
    # doc: per-layer CUDA graphs of the train pass (fewer kernel launches from the host): none, or transformer_engine (megatron-core's TECudaGraphHelper; needs TE and bf16). Every training micro-batch is padded to one fixed shape, micro_batch_size rows x seq_length tokens (packed: one row of max_tokens_per_micro_batch tokens); the logprob pass stays eager. Known issue: on the slice, repeated graphed passes from the same weights have given gradients up to 0.6% apart (an open race, off by default until found). docs/megatron.md, "CUDA graphs"
    cuda_graph_impl: Literal["none", "transformer_engine"] = "none"
    # doc: what each layer's graphs capture (megatron-core's names): attn (norm + attention), mlp (the dense layers' MLP), moe_router (pre-MLP norm + router), moe_preprocess (the token dispatcher's preprocess; with moe_router). The experts and the token all-to-alls stay eager
    cuda_graph_modules: tuple[str, ...] = ("attn", "moe_router", "moe_preprocess")


@dataclass(frozen=True)
class OptimConfig:
    optimizer: Literal["adam"] = "adam"  # doc: AdamW
    lr: float = 1e-6  # doc: peak learning rate
    weight_decay: float = 0.01  # doc: decoupled weight decay
    adam_beta1: float = 0.9  # doc: Adam beta1
    adam_beta2: float = 0.999  # doc: Adam beta2
    adam_eps: float = 1e-8  # doc: Adam epsilon
    clip_grad: float = 1.0  # doc: global grad-norm clip
    use_distributed_optimizer: bool = True  # doc: megatron: shard optimizer state over DP
    # doc: megatron: optimizer states in the dtypes below (Transformer Engine's FusedAdam; without TE: fp32 masters, fp32/bf16 moments in rlinf's CompactAdamW)
    use_precision_aware_optimizer: bool = False
    main_params_dtype: str = "fp32"  # doc: megatron master weights: fp32 or fp16 (no bf16/FP8 masters exist)
    main_grads_dtype: str = "fp32"  # doc: megatron gradient buffers / reduction: fp32 or bf16
    # doc: megatron Adam first moment: fp32, fp16, bf16 or fp8 (with TE's FusedAdam, which rounds to nearest, a format that cannot hold adam_beta1's decay is refused: fp8 needs adam_beta1 <= 0.9375)
    exp_avg_dtype: str = "fp32"
    # doc: megatron Adam second moment: fp32, fp16, bf16 or fp8 (with TE's FusedAdam, which rounds to nearest, a format that cannot hold adam_beta2's decay is refused: 0.999 needs fp32 or fp16; bf16 holds <= 0.99609)
    exp_avg_sq_dtype: str = "fp32"


@dataclass(frozen=True)
class LRSchedulerConfig:
    # doc: LR schedule: constant; warmup_constant (linear warmup, then the peak); cosine (the same warmup, then a half cosine from optim.lr to optim.lr x min_lr_ratio over lr_decay_steps)
    lr_decay_style: LRDecayStyle = "constant"
    lr_warmup_steps: int = 0  # doc: linear warmup optimizer steps
    # doc: cosine: optimizer steps (warmup included) at whose end the LR reaches its floor; null = the run's, runner.max_steps x minibatches per step
    lr_decay_steps: int | None = None
    # doc: cosine: the LR's floor as a fraction of optim.lr, reached at lr_decay_steps and held
    min_lr_ratio: float = 0.0
    # doc: resuming a checkpoint whose recorded LR schedule (style, optim.lr, warmup, decay steps, floor) differs from this run's: error stops before Ray, naming the differences; use_checkpoint keeps the checkpoint's schedule; override follows this run's from the checkpoint's optimizer step (Megatron-LM's --use-checkpoint-opt_param-scheduler / --override-opt_param-scheduler)
    on_resume: Literal["error", "use_checkpoint", "override"] = "error"


@dataclass(frozen=True)
class ActorConfig:
    training_backend: str = "torch"  # doc: torch (embedded) or megatron
    micro_batch_size: int = 4  # doc: sequences per forward/backward (without max_tokens_per_micro_batch)
    # doc: tokens per forward/backward (padded: rows x (longest prompt + longest response); packed: the rows' real tokens): micro-batches of rows of similar length, as many on every DP rank; null = micro_batch_size rows
    max_tokens_per_micro_batch: int | None = None
    # doc: sequences per forward of the logprob pass (the recompute before training: no gradients and no activations kept, so it can take more rows than a training micro-batch; fewer, larger forwards cost the host less); null = micro_batch_size. Without max_tokens_per_micro_batch only (verl: log_prob_micro_batch_size_per_gpu)
    logprob_micro_batch_size: int | None = None
    # doc: tokens per forward of the logprob pass, with max_tokens_per_micro_batch only; null = max_tokens_per_micro_batch (verl: log_prob_max_token_len_per_gpu)
    logprob_max_tokens_per_micro_batch: int | None = None
    # doc: each micro-batch runs as one row of its sequences' real tokens, no padding. torch backend: block-diagonal causal attention from position ids; with sdpa the mask makes attention cover the whole packed row, so it pays only where padding, not attention, dominates (docs/benchmarks.md). megatron: THD sequences (PackedSeqParams); the TE-free attention runs one SDPA call per sequence (equal to the padded forward on CPU and H200; 1.45x the padded real tokens/s on varied lengths, one GPU; not yet run at TP > 1)
    pack_sequences: bool = False
    global_batch_size: int = 32  # doc: sequences per optimizer step (a minibatch), across DP ranks
    seq_length: int = 2048  # doc: max prompt + response tokens
    model: ModelConfig = field(default_factory=ModelConfig)  # doc: model and parallelism
    optim: OptimConfig = field(default_factory=OptimConfig)  # doc: optimizer
    lr_sched: LRSchedulerConfig = field(default_factory=LRSchedulerConfig)  # doc: LR schedule
    # doc: colocated: move weights/optimizer off GPU during rollout; auto: offload in step 1, then keep the actor resident if the measured rollout peak plus what the offload freed fits the GPU
    offload_between_phases: bool | Literal["auto"] = False
    num_threads: int | None = None  # doc: torch CPU threads per actor worker; null = torch default
    # doc: torch backend: data-parallel actor workers (DDP; gloo on CPU, NCCL with one per placed GPU)
    num_workers: int = 1


@dataclass(frozen=True)
class SGLangConfig:
    enable_ep_moe: bool = True  # doc: expert-parallel MoE (ep_size = tensor_parallel_size)
    attention_backend: str = "fa3"  # doc: SGLang attention backend
    # doc: SGLang attention backend for decode only (e.g. flashinfer, flashmla); attention_backend then serves prefill; null = the measured choice where it runs (flashinfer on Hopper for 512 + 64 MLA heads; docs/sglang.md), else attention_backend for both
    decode_attention_backend: str | None = None
    cuda_graph_max_bs: int = 256  # doc: largest CUDA-graph batch; 0 = no CUDA graphs
    max_running_requests: int | None = None  # doc: requests decoded together; null = SGLang sizes it
    deterministic_inference: bool = False  # doc: reproducible sampling (per-request seeds), slower


@dataclass(frozen=True)
class RolloutModelConfig:
    model_path: str = ""  # doc: defaults to actor.model.model_path when empty
    model_type: str = "deepseek_v3"  # doc: architecture family
    precision: Precision = "bf16"  # doc: rollout dtype


@dataclass(frozen=True)
class RolloutConfig:
    rollout_backend: str = "torch"  # doc: torch (embedded) or sglang
    model: RolloutModelConfig = field(default_factory=RolloutModelConfig)  # doc: rollout model
    tensor_parallel_size: int = 1  # doc: GPUs per rollout engine
    gpu_memory_utilization: float = 0.5  # doc: fraction of GPU memory for weights + KV cache
    max_batch_size: int = 256  # doc: torch backend: sequences decoded together
    weight_sync_bucket_mb: int = 512  # doc: weight sync bucket size
    sglang: SGLangConfig = field(default_factory=SGLangConfig)  # doc: SGLang engine options


@dataclass(frozen=True)
class OverlongBufferConfig:
    # doc: DAPO soft overlong punishment: a response longer than max_new_tokens - len loses up to penalty_factor, linearly in the excess, before advantages (docs/rollout.md)
    enable: bool = False
    len: int = 4096  # doc: buffer tokens below algorithm.sampling_params.max_new_tokens where the penalty ramps from 0
    penalty_factor: float = 1.0  # doc: penalty at the length limit (subtracted from the reward)


@dataclass(frozen=True)
class RewardConfig:
    reward_type: str = "math"  # doc: reward function (math)
    reward_scale: float = 5.0  # doc: +scale for a right answer, -scale for a wrong one
    timeout_s: float = 5.0  # doc: per-answer grading timeout (scored wrong, counted in reward/timeouts)
    num_workers: int = 2  # doc: grading processes
    overlong_buffer: OverlongBufferConfig = field(
        default_factory=OverlongBufferConfig
    )  # doc: overlong reward shaping


@dataclass(frozen=True)
class Config:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)  # doc: Ray cluster and placement
    runner: RunnerConfig = field(default_factory=RunnerConfig)  # doc: loop, logging, checkpoints
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)  # doc: GRPO maths
    data: DataConfig = field(default_factory=DataConfig)  # doc: datasets
    actor: ActorConfig = field(default_factory=ActorConfig)  # doc: trainer
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # doc: generation
    reward: RewardConfig = field(default_factory=RewardConfig)  # doc: reward
