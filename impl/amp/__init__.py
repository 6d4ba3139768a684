"""Mixed precision across ranks: a gradient scaler whose skip decision every rank shares,
and a finder for the first non-finite gradient.

    grad_scaler  DistributedGradScaler (torch.amp.GradScaler's contract, the non-finite
                 check agreed across a process group, step returning whether it stepped)
    nonfinite    first_nonfinite_gradient(model, group)
"""

from .grad_scaler import DistributedGradScaler
from .nonfinite import first_nonfinite_gradient

__all__ = ["DistributedGradScaler", "first_nonfinite_gradient"]
