"""Layouts and treedef entries: interned once per structure, also across threads."""

import inspect
import linecache
import sys
import threading

import jax
import numpy as np

from pytree_module import Module
from pytree_module.extend import flat_form


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


def test_the_generated_source_defines_the_whole_treedef_entry():
    class Sized(Module):
        def __init__(self):
            self.weight = np.zeros(2)
            self.size = 2

    _, entry = flat_form(Sized())
    source = "".join(linecache.getlines(entry.__code__.co_filename))
    assert inspect.getsource(entry).startswith("    def build(children):")
    for line in (
        "d['size'] = s0",
        "d['weight'] = children[0]",
        "build.layout = layout",
        "build.statics = statics",
        "build.get_data = layout.get_data",
        "build.__name__ = build.__qualname__ = name",
    ):
        assert line in source, line
    assert entry.__name__ == entry.__qualname__ == "Sized(size=2)"
