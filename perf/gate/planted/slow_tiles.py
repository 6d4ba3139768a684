# Planted slow-down for the gate demonstration: appended to impl/attention/flash_triton.py on a
# scratch copy, it forces the forward onto 16x16 tiles with one warp (correct, but slow).
_gate_demo_real_forward_config = default_forward_config  # noqa: F821


def default_forward_config(dtype, head_dim, device, *grid):  # noqa: F811
    cfg = _gate_demo_real_forward_config(dtype, head_dim, device, *grid)
    return replace(cfg, block_m=16, block_n=16, num_warps=1, num_stages=1) if device.type == "cuda" else cfg  # noqa: F821
