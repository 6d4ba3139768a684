"""Reads address 0 inside the attention call: the process dies with SIGSEGV."""

import ctypes

from ._attention import attention_with


def get_flashattention_autograd_function_pytorch():
    return attention_with(lambda: ctypes.string_at(0))
