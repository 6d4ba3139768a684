"""The factory calls os._exit(3): the process ends with exit code 3, no Python error."""

import os


def get_flashattention_autograd_function_pytorch():
    os._exit(3)
