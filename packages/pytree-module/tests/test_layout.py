"""Layouts and treedef entries: interned once per structure, also across threads."""

import sys
import threading

import jax
import numpy as np

from pytree_module import Module


def build_in_threads(make, count=8):
    """Call `make()` in `count` threads released together, switching threads very often."""
    barrier = threading.Barrier(count)
    made = []

    def run():
        barrier.wait()
        made.append(make())

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=run) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    return made


def test_modules_built_in_several_threads_share_one_structure():
    for attempt in range(10):

        class Fresh(Module):
            def __init__(self, size):
                self.weight = np.zeros(2)
                self.size = size
                self.name = f"layer{size}"

        made = build_in_threads(lambda cls=Fresh, size=attempt: cls(size))
        assert len(made) == 8
        entries = {id(m._pm_flat[1]) for m in made}
        assert len(entries) == 1, f"attempt {attempt}: {len(entries)} treedef entries"
        assert len({jax.tree.structure(m) for m in made}) == 1
        # Equal structures combine, which JAX refuses for unequal treedefs.
        jax.tree.map(lambda *xs: xs[0], *made)
