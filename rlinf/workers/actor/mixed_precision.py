"""fp32 master weights for a model computing in bf16/fp16.

AdamW applied straight to bf16 parameters loses small updates: a bf16 weight near 0.05 moves only
in steps of about 2e-4, so an lr-1e-6 update rounds away. The optimizer therefore owns fp32 copies;
after each step the model's low-precision parameters are refreshed from them.
"""

from __future__ import annotations

import torch


class MasterWeights:
    """The tensors the optimizer updates: the model's own parameters (fp32) or fp32 copies."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model_params = [p for p in model.parameters() if p.requires_grad]
        self.copies = any(p.dtype != torch.float32 for p in self.model_params)
        if self.copies:
            self.params = [torch.nn.Parameter(p.detach().float().clone()) for p in self.model_params]
        else:
            self.params = self.model_params

    def grads_to_master(self) -> None:
        """Before clipping: the fp32 master grads are the model's grads, upcast."""
        if not self.copies:
            return
        for master, param in zip(self.params, self.model_params, strict=True):
            master.grad = None if param.grad is None else param.grad.float()

    @torch.no_grad()
    def master_to_model(self) -> None:
        """After the optimizer step: round the fp32 weights into the model's dtype."""
        if not self.copies:
            return
        for master, param in zip(self.params, self.model_params, strict=True):
            param.copy_(master)

    @torch.no_grad()
    def model_to_master(self) -> None:
        """After loading weights into the model (a checkpoint without fp32 masters)."""
        if not self.copies:
            return
        for master, param in zip(self.params, self.model_params, strict=True):
            master.copy_(param)

    def zero_grad(self) -> None:
        if self.copies:
            for master in self.params:
                master.grad = None

    def state(self) -> list[torch.Tensor] | None:
        return [m.detach().cpu().clone() for m in self.params] if self.copies else None

    @torch.no_grad()
    def load_state(self, tensors: list[torch.Tensor] | None) -> None:
        if not self.copies:
            return
        if tensors is None:
            self.model_to_master()
            return
        for master, saved in zip(self.params, tensors, strict=True):
            master.copy_(saved)

    def move_to(self, device: torch.device) -> None:
        if self.copies:
            for master in self.params:
                master.data = master.data.to(device)
