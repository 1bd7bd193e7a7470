import pytest


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `python3 -m pytest -m gpu` on the device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
