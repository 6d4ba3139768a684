"""Models the parallel pieces are applied to and benchmarked on.

    gpt   a GPT-style decoder (the CS336 basics model's shape) with a choice of attention
"""
