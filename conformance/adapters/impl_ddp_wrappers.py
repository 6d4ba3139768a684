"""Internal targets for this project's naive and flat wrappers, and the bucketed one
with its side stream on.

They are not CS336 entry points, so the default target ``impl`` does not hand them out;
these small objects expose them under the 2026 names (``get_ddp``,
``ddp_on_after_backward``) so the same laws check them:

    pytest properties/test_ddp.py --target conformance.adapters.impl_ddp_wrappers:naive
    pytest properties/test_ddp.py --target conformance.adapters.impl_ddp_wrappers:flat

    pytest properties/test_ddp.py --target conformance.adapters.impl_ddp_wrappers:bucketed_side_stream

(With the default target, properties/test_ddp.py checks all three too.)  The side stream
only exists on CUDA: on the CPU that target is the default wrapper again.
"""

from __future__ import annotations


class WrapperTarget:
    """Hands out one wrapper class through the 2026 DDP adapter names."""

    def __init__(self, class_name: str):
        self.class_name = class_name

    def _cls(self):
        from impl import ddp

        return getattr(ddp, self.class_name)

    def get_ddp(self, module):
        return self._cls()(module)

    def ddp_on_after_backward(self, model, optimizer):
        model.finish_gradient_synchronization()

    def __repr__(self) -> str:
        return f"WrapperTarget({self.class_name})"


naive = WrapperTarget("NaiveDDP")
flat = WrapperTarget("FlatDDP")
individual = WrapperTarget("OverlappedIndividualDDP")
bucketed = WrapperTarget("BucketedDDP")


class SideStreamBucketed:
    """BucketedDDP(side_stream=True) through the 2025 bucketed adapter names."""

    def get_ddp_bucketed(self, module, bucket_size_mb):
        from impl.ddp import BucketedDDP

        return BucketedDDP(module, bucket_size_mb=bucket_size_mb, side_stream=True)

    def ddp_bucketed_on_after_backward(self, model, optimizer):
        model.finish_gradient_synchronization()

    def ddp_bucketed_on_train_batch_start(self, model, optimizer):
        model.on_train_batch_start()

    def __repr__(self) -> str:
        return "SideStreamBucketed()"


bucketed_side_stream = SideStreamBucketed()
