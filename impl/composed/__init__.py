"""Parallelisms composed on a mesh (``impl.mesh``): DP x TP, FSDP x TP, DP x PP, PP x TP,
TP x CP, PP x CP, DP x CP, PP x DP x TP, on the GPT-style model of ``impl.models.gpt``.

    step    ``Composer`` and ``composed_train_step`` (its docstring is the contract)
"""

from .step import ComposedResult, Composer, composed_train_step

__all__ = ["ComposedResult", "Composer", "composed_train_step"]
