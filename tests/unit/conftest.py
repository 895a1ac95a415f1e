import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models: one thread is fastest and immune to a busy machine (run_training sets it too)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
