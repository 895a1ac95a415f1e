"""FedSAM (Qu et al., ICML 2022): local steps with sharpness-aware minimisation (ascend by ρ·g/‖g‖, step from w).

Each local step:

1. g = ∇L(w) on the minibatch (L is `self.local_loss`, so a loss-changing parent composes);
2. e = ρ·g/‖g‖ with ‖g‖ the global L2 norm over all parameters (e = 0 when ‖g‖ = 0);
3. g_SAM = ∇L(w + e) on the same minibatch;
4. restore w exactly (a saved copy, not w + e − e, which rounds), run `after_backward` on g_SAM
   (so FedProx's proximal term or FedDyn's linear/quadratic terms are added at w, composing), and
   let the optimiser step with it.

The ascent direction uses the plain local-loss gradient (the paper's ∇F_i(w)); `after_backward`
terms affect only the descent step. The loss reported for the step is L(w), before the ascent.
Buffers (BatchNorm running statistics) keep the values from the forward pass at w: the pass at
w + e is a probe and must not count twice. The server side is FedAvg's.
"""

import torch
from torch import nn

from fedskew.fl.base import ClientContext, FederatedAlgorithm, Hyperparameter
from fedskew.numerics.sgd import LocalOptimizer


class FedSAM(FederatedAlgorithm):
    name = "fedsam"
    # ρ = 0.05, the perturbation radius of the FedSAM paper (and of SAM's CIFAR setting).
    hyperparameters = {"rho": Hyperparameter(0.05, minimum=0)}

    def _minibatch_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                        client: ClientContext) -> torch.Tensor:
        features = model.body(x)
        return self.local_loss(model.head(features), features, y, client, x=x)

    def local_step(self, model: nn.Module, optimizer: LocalOptimizer, x: torch.Tensor,
                   y: torch.Tensor, client: ClientContext) -> torch.Tensor:
        rho = self.hp["rho"]
        params = [p for p in model.parameters() if p.requires_grad]

        # 1. gradient at w
        optimizer.zero_grad(set_to_none=True)
        loss = self._minibatch_loss(model, x, y, client)
        loss.backward()

        with torch.no_grad():
            saved_buffers = [b.clone() for b in model.buffers()]
            saved_params = [p.detach().clone() for p in params]
            grads = [p.grad for p in params]
            present = [g for g in grads if g is not None]
            if present:
                norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in present]))
                # ‖g‖ = 0 means g = 0, so e = 0·(ρ/tiny) = 0: no ascent, no division by zero, no host sync.
                scale = rho / norm.clamp_min(torch.finfo(norm.dtype).tiny)
                # 2. ascend to w + e
                for param, grad in zip(params, grads):
                    if grad is not None:
                        param.add_(grad * scale)

        # 3. gradient at w + e
        optimizer.zero_grad(set_to_none=True)
        self._minibatch_loss(model, x, y, client).backward()

        # 4. back to w, then the usual hooks and step with the perturbed gradient
        with torch.no_grad():
            for param, saved in zip(params, saved_params):
                param.copy_(saved)
            for buffer, saved in zip(model.buffers(), saved_buffers):
                buffer.copy_(saved)
        self.after_backward(model, client)
        optimizer.step()
        return loss.detach()
