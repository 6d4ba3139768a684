"""Aborts inside the attention call (SIGABRT), as a failed C assertion does."""

import os

from ._attention import attention_with


def get_flashattention_autograd_function_pytorch():
    return attention_with(os.abort)
