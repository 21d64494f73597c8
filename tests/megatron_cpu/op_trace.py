"""The same points of transformers' DeepseekV3 forward and of the Megatron actor's GPTModel forward,
taken by forward hooks, for op-by-op comparisons (test_hf_parity.py on the CPU,
tests/gpu/bf16_op_errors.py on the GPU).

Both take full rows (no padding, positions 0..T-1) on the model's device and give, batch first:
`embedding`; per layer i `i.attention`, `i.mlp` (the MoE layer's output, shared experts included)
and `i.layer`; for MoE layers `i.routing` (each token's routing weights over all experts, 0 where
not chosen, the scaling factor applied) and `i.experts` (each token's chosen experts, sorted);
then `final_norm`, `logits` and `logprobs` (next-token, fp32 log-softmax over the full vocabulary).
"""

from __future__ import annotations

import torch


def next_token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return lp.gather(-1, tokens[:, 1:, None].to(lp.device))[..., 0]


def _keep(trace: dict, name: str, pick):
    def hook(_module, _inputs, out):
        trace[name] = pick(out).detach().float().clone()  # a later in-place op may reuse it

    return hook


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _run(trace: dict, hooks: list, forward, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """`forward()` without grad, the hooks filling `trace`; then the logits and logprobs."""
    try:
        with torch.no_grad():
            logits = forward()
    finally:
        for h in hooks:
            h.remove()
    trace["logits"] = logits.float()
    trace["logprobs"] = next_token_logprobs(logits, tokens)
    return trace


def hf_points(model, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """The points of a transformers DeepseekV3ForCausalLM's forward over `tokens` [b, t]."""
    trace: dict[str, torch.Tensor] = {}
    b, t = tokens.shape
    hooks = [model.model.embed_tokens.register_forward_hook(_keep(trace, "embedding", _first))]
    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.self_attn.register_forward_hook(_keep(trace, f"{i}.attention", _first)))
        hooks.append(layer.mlp.register_forward_hook(_keep(trace, f"{i}.mlp", _first)))
        hooks.append(layer.register_forward_hook(_keep(trace, f"{i}.layer", _first)))
        if hasattr(layer.mlp, "gate"):
            experts = model.config.n_routed_experts

            def routing(out, experts=experts):  # (router logits, top-k weights, top-k indices)
                dense = torch.zeros(out[2].shape[0], experts, device=out[1].device, dtype=out[1].dtype)
                return dense.scatter(1, out[2], out[1]).view(b, t, experts)

            hooks.append(layer.mlp.gate.register_forward_hook(_keep(trace, f"{i}.routing", routing)))
            chosen = lambda out: out[2].sort(-1)[0].view(b, t, -1)  # noqa: E731
            hooks.append(layer.mlp.gate.register_forward_hook(_keep(trace, f"{i}.experts", chosen)))
    hooks.append(model.model.norm.register_forward_hook(_keep(trace, "final_norm", _first)))
    return _run(trace, hooks, lambda: model(input_ids=tokens).logits, tokens)


def megatron_points(model, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """The points of a megatron-core GPTModel's forward over `tokens` [b, t] (its activations are
    sequence first, [t, b, ...], and its router sees tokens in that order)."""
    trace: dict[str, torch.Tensor] = {}
    b, t = tokens.shape
    batch_first = lambda out: _first(out).transpose(0, 1)  # noqa: E731

    def routing(out):  # (probs [t*b, E], routing map [t*b, E])
        return out[0].view(t, b, -1).transpose(0, 1)

    def experts(out):
        chosen = out[1].view(t, b, -1).transpose(0, 1)
        k = int(chosen[0, 0].sum())
        return chosen.float().topk(k, dim=-1)[1].sort(-1)[0]

    hooks = [model.embedding.register_forward_hook(_keep(trace, "embedding", batch_first))]
    for i, layer in enumerate(model.decoder.layers):
        hooks.append(layer.self_attention.register_forward_hook(_keep(trace, f"{i}.attention", batch_first)))
        hooks.append(layer.mlp.register_forward_hook(_keep(trace, f"{i}.mlp", batch_first)))
        hooks.append(layer.register_forward_hook(_keep(trace, f"{i}.layer", batch_first)))
        if hasattr(layer.mlp, "router"):
            hooks.append(layer.mlp.router.register_forward_hook(_keep(trace, f"{i}.routing", routing)))
            hooks.append(layer.mlp.router.register_forward_hook(_keep(trace, f"{i}.experts", experts)))
    hooks.append(model.decoder.final_layernorm.register_forward_hook(_keep(trace, "final_norm", batch_first)))
    positions = torch.arange(t, device=tokens.device).expand_as(tokens)
    return _run(
        trace, hooks, lambda: model(input_ids=tokens, position_ids=positions, attention_mask=None), tokens
    )


def errors(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per point: the share of tokens whose expert set differs (`experts`), mean |difference|
    (`logprobs`), relative Frobenius error (the rest)."""
    out = {}
    for name, exact in ref.items():
        value = got[name]
        if name.endswith("experts"):
            out[name] = (value != exact).any(-1).float().mean().item()
        elif name == "logprobs":
            out[name] = (value - exact).abs().mean().item()
        else:
            out[name] = ((value - exact).norm() / exact.norm()).item()
    return out
