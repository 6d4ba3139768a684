"""The compile check's spill mutant (hopper_compile._hold_fixed_tiles_in_registers): the Gluon
flavour's ``_fixed_tile_at`` as it was before it, a fixed tile seen at the constant slot 0, so
the compiler forms its wgmma descriptors once before the loop and holds them in registers."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def fixed_tile_at_slot_0(one_slot, i, BLOCK: gl.constexpr, HEAD_DIM: gl.constexpr):
    return one_slot.index(0).reshape([BLOCK, HEAD_DIM])
