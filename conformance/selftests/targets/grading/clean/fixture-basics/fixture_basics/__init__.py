import importlib.metadata

__version__ = importlib.metadata.version("fixture-basics")


def items(n: int) -> range:
    return range(n)
