import pytest
import torch


@pytest.fixture
def generator():
    g = torch.Generator()
    g.manual_seed(0)
    return g
