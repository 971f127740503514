"""Filters side by side with Flax NNX's `filterlib` (runs in the bench environment)."""

import pytest

nnx = pytest.importorskip("flax.nnx")

from flax.nnx import filterlib  # noqa: E402

from pytree_filter import PathContains, to_predicate  # noqa: E402

PATHS = [
    (),
    ("bias",),
    ("layers", 0, "bias_scale"),
    ("layers", 10, "kernel"),
    ("layer1", "w"),
    ("head", 2),
]
VALUES = [1, "x", 2.5, None]


def _same(ours, theirs):
    for path in PATHS:
        for value in VALUES:
            assert bool(ours(path, value)) == bool(theirs(path, value)), (path, value)


@pytest.mark.parametrize(
    "spec",
    [
        (int, str),
        [float, int],
        (int, lambda path, x: "bias" in path),
        [(int,), [str]],
        lambda path, x: len(path) > 1,
        (),
    ],
    ids=[
        "tuple of types",
        "list of types",
        "tuple with path function",
        "nested",
        "function",
        "empty",
    ],
)
def test_the_same_selection_as_nnx(spec):
    _same(to_predicate(spec), filterlib.to_predicate(spec))


@pytest.mark.parametrize("key", ["bias", 1, 0, "layer", "kernel"])
@pytest.mark.parametrize("exact", [True, False])
def test_path_contains_as_nnx(key, exact):
    _same(PathContains(key, exact=exact), filterlib.PathContains(key, exact=exact))


class _Tagged:
    def __init__(self, tag):
        self.tag = tag


@pytest.mark.parametrize("spec", ["dropout", None, ("params", int), ["x", None]])
def test_strings_and_none_as_flax_nnx_reads_them(spec):
    ours, theirs = to_predicate(spec), filterlib.to_predicate(spec)
    for value in [*VALUES, _Tagged("dropout"), _Tagged("params"), _Tagged("x")]:
        for path in PATHS:
            assert bool(ours(path, value)) == bool(theirs(path, value)), (spec, path, value)
