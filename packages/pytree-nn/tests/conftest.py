"""Device markers: the cpu test variant fakes 8 devices; the cuda and tpu variants run only
the tests marked multi_device or accelerator (`-m "multi_device or accelerator"`, set in
hatch.toml). The multi_process tests start processes of fake CPU devices on any variant."""

import pathlib
import sys

import jax
import pytest

# The tests import the helper modules beside them by name (`from local_processes import
# run_processes`), and --import-mode=importlib (pytest.ini) puts no test folder on sys.path.
sys.path.append(str(pathlib.Path(__file__).parent))

MARKERS = {
    "multi_device": "needs 8 devices: fake CPU devices (the cpu variant's XLA_FLAGS) or real ones",
    "accelerator": "needs at least 2 GPUs or TPUs (checks what only they report, such as "
    "device memory); skipped on CPU",
    "multi_process": "starts several JAX processes on localhost (local_processes.py), each "
    "of fake CPU devices, joined by jax.distributed into one mesh",
}


def pytest_configure(config):
    for name, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


def pytest_collection_modifyitems(config, items):
    devices = jax.devices()
    skips = {
        "multi_device": pytest.mark.skip(
            reason="needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)"
        )
        if len(devices) < 8
        else None,
        "accelerator": pytest.mark.skip(reason="needs at least 2 GPUs or TPUs")
        if devices[0].platform == "cpu" or len(devices) < 2
        else None,
    }
    for item in items:
        for name, skip in skips.items():
            if skip is not None and item.get_closest_marker(name):
                item.add_marker(skip)
