"""Attention: the eager reference and FlashAttention-2 in PyTorch tiles and in Triton.

    reference      eager attention, the reference every attention check uses
    flash_pytorch  FlashAttention-2 forward and backward in PyTorch tiles
    flash_triton   FlashAttention-2 forward and backward in Triton kernels
    validation     the input checks both flavours share (shapes, dtypes, devices)
"""
