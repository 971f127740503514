"""`capture` side by side with Flax NNX (bench environment)."""

import jax.numpy as jnp
import numpy as np
import pytest

nnx = pytest.importorskip("flax.nnx")

import pytree_graph as pg  # noqa: E402
import pytree_nn as pn  # noqa: E402


def make(lib, base, Intermediate):
    class Foo(base):
        def __call__(self, x):
            x2 = self.perturb("grad_of_x", x)
            self.sow(Intermediate, "h", 3 * x2)
            return 3 * x2

    return Foo()


def run(lib, Intermediate, Perturbation, grad):
    model = make(lib, lib.Module, Intermediate)
    x = jnp.array(2.0)
    y, perturbations = lib.capture(model, Perturbation)(x)

    def loss(model, perturbations, x):
        return lib.capture(model, Intermediate, init=perturbations)(x)

    grads, sowed = grad(loss, argnums=1, has_aux=True)(model, perturbations, x)
    read = (lambda v: v.value) if lib is pn else (lambda v: v.get_value())
    return (
        float(y),
        {path: np.asarray(read(v)) for path, v in _flat(perturbations, lib)},
        {path: np.asarray(read(v)) for path, v in _flat(grads, lib)},
        {path: np.asarray(read(v)) for path, v in _flat(sowed, lib)},
    )


def _flat(state, lib):
    return sorted(state.flat_state().items()) if lib is pn else sorted(nnx.to_flat_state(state))


def test_same_values_perturbations_gradients_and_records():
    ours = run(pn, pg.Intermediate, pg.Perturbation, pg.grad)
    theirs = run(nnx, nnx.Intermediate, nnx.Perturbation, nnx.grad)
    assert ours[0] == theirs[0]
    for a, b in zip(ours[1:], theirs[1:], strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(
                np.asarray(a[key]), np.asarray(b[key]).reshape(np.shape(a[key]))
            )
