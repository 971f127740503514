"""Device markers: the cpu test variant fakes 8 devices; the cuda and tpu variants run only
the tests marked here (`-m "multi_device or accelerator"`, set in hatch.toml)."""

import jax
import pytest

MARKERS = {
    "multi_device": "needs 8 devices: fake CPU devices (the cpu variant's XLA_FLAGS) or real ones",
    "accelerator": "needs at least 2 GPUs or TPUs (checks what only they report, such as "
    "device memory); skipped on CPU",
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
