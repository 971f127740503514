"""`MLP(scan=True)` side by side with Equinox's `eqx.nn.MLP(scan=True)`: the same layer
structure (first, stacked, last; an empty stack for depth 1) and, with Equinox's weights
copied in, the same outputs.

Equinox's `Linear` holds `weight` of shape `(out, in)` and takes one example; ours holds
`kernel` of shape `(in, out)` and takes any batch axes.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_nn import MLP

eqx = pytest.importorskip("equinox")


def _copy_weights(theirs, ours):
    """Put Equinox's weights and biases into our MLP, transposing the kernels (the stacked
    one's layer axis stays first)."""
    for their_layer, our_layer in zip(theirs.layers, ours.layers, strict=True):
        our_layer.kernel.value = jnp.swapaxes(their_layer.weight, -1, -2)
        if their_layer.bias is not None:
            our_layer.bias.value = their_layer.bias


@pytest.mark.parametrize("depth", [0, 1, 2, 5])
@pytest.mark.parametrize("use_bias", [True, False])
def test_scanned_mlp_matches_equinox(depth, use_bias):
    theirs = eqx.nn.MLP(
        3, 2, 6, depth, activation=jnp.tanh, use_bias=use_bias, scan=True, key=jax.random.key(0)
    )
    ours = MLP(3, 2, 6, depth, activation=jnp.tanh, use_bias=use_bias, scan=True, rngs=0)
    assert len(ours.layers) == len(theirs.layers)
    for their_layer, our_layer in zip(theirs.layers, ours.layers, strict=True):
        assert our_layer.kernel.value.shape == jnp.swapaxes(their_layer.weight, -1, -2).shape
        assert (our_layer.bias is None) == (their_layer.bias is None)
    _copy_weights(theirs, ours)
    x = jax.random.normal(jax.random.key(1), (4, 3))
    np.testing.assert_allclose(ours(x), jax.vmap(theirs)(x), rtol=1e-5, atol=1e-6)


def test_scan_gives_both_libraries_the_same_function_as_without():
    x = jax.random.normal(jax.random.key(1), (4, 3))
    theirs = [eqx.nn.MLP(3, 2, 6, 4, scan=s, key=jax.random.key(0)) for s in (False, True)]
    ours = [MLP(3, 2, 6, 4, scan=s, rngs=0) for s in (False, True)]
    np.testing.assert_allclose(jax.vmap(theirs[1])(x), jax.vmap(theirs[0])(x), rtol=1e-6)
    np.testing.assert_allclose(ours[1](x), ours[0](x), rtol=1e-6)
