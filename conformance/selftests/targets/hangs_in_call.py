"""Never returns from the attention call."""

import time

from ._attention import attention_with


def get_flashattention_autograd_function_pytorch():
    return attention_with(lambda: time.sleep(10**6))
