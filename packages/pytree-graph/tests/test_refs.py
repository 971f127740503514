"""The refx layer: deref/reref keep sharing across any transform; updating Variables."""

import jax
import jax.numpy as jnp
import pytest

from pytree_filter import filter as filter_tree
from pytree_filter import partition
from pytree_graph import Param, Variable, VariableIndex, VariableValue, deref, reref, update
from pytree_module import Module, TraceContextError


class Collection(Variable):
    pass


class BatchStats(Variable):
    pass


def test_shared_references():
    r1, r2 = Variable(1), Variable(2)
    tree = {"a": [r1, r1, r2], "b": r2}
    tree["a"][0].value = 10
    assert tree["a"][1].value == 10


def test_deref_reref_across_jit():
    r1, r2 = Variable(jnp.array(1)), Variable(jnp.array(2))
    tree = {"a": [r1, r1, r2], "b": r2}
    plain = deref(tree)
    assert isinstance(plain["a"][0], VariableValue) and isinstance(plain["a"][1], VariableIndex)
    assert len(jax.tree.leaves(plain)) == 2  # each shared Variable's value once

    @jax.jit
    def f(plain):
        tree = reref(plain)
        tree["a"][2].value = jnp.array(50)  # also tree["b"]: the same Variable
        return deref(tree)

    out = reref(f(plain))
    assert int(out["b"].value) == 50
    assert out["a"][0] is out["a"][1] and out["a"][2] is out["b"]


def test_sharing_survives_other_transforms():
    w = Param(jnp.array(3.0))
    tree = {"encoder": w, "decoder": w}

    def loss(plain):
        tree = reref(plain)
        return tree["encoder"].value * tree["decoder"].value

    grads = reref(jax.grad(loss)(deref(tree)))
    assert grads["encoder"] is grads["decoder"]
    assert float(grads["encoder"].value) == 6.0  # d(w*w)/dw, one shared leaf
    batched = jax.vmap(lambda plain: deref(reref(plain)))(
        deref({"a": Param(jnp.arange(3.0)), "b": [Param(jnp.ones(3))]})
    )
    assert reref(batched)["a"].value.shape == (3,)


def test_deref_works_on_modules():
    class Tied(Module):
        def __init__(self):
            self.encoder = Param(jnp.ones(2))
            self.decoder = self.encoder

    model = Tied()
    plain = deref(model)
    # Attributes in name order: `decoder` comes first, so it holds the value.
    assert isinstance(plain.decoder, VariableValue) and isinstance(plain.encoder, VariableIndex)
    again = reref(plain)
    assert again.encoder is again.decoder and isinstance(again, Tied)


def test_mutation_from_another_trace_is_refused():
    r = Variable(1)

    @jax.jit
    def f():
        r.value = jnp.array(1.0)

    with pytest.raises(TraceContextError):
        f()


def test_partition_by_collection_and_update():
    r1 = Collection(jnp.array(1.0), collection="params")
    r2 = BatchStats(jnp.array(2.0), collection="batch_stats")
    tree = {"a": [r1, r1, r2], "b": r2}

    def by_collection(c):
        return lambda x: isinstance(x, Variable) and x.metadata.get("collection") == c

    from pytree_filter import Filter

    class CollectionIs(Filter):
        def __init__(self, name):
            object.__setattr__(self, "name", name)

        def __call__(self, path, value):
            return by_collection(self.name)(value)

        def leaf_types(self):
            return (Variable,)

        def __eq__(self, other):
            return isinstance(other, CollectionIs) and other.name == self.name

        def __hash__(self):
            return hash(self.name)

    params, rest = partition(tree, CollectionIs("params"))
    assert params["a"][0] is r1 and params["a"][2] is None and params["b"] is None
    assert rest["a"][2] is r2

    plain = deref(tree)

    def loss(values):
        tree = reref(values)
        return tree["a"][0].value * 3 + tree["b"].value

    grads = jax.grad(loss)(plain)
    new_values = jax.tree.map(lambda w, g: w - 0.1 * g, plain, grads)
    update(tree, new_values)
    assert float(r1.value) == pytest.approx(1.0 - 0.3)
    assert float(r2.value) == pytest.approx(2.0 - 0.1)

    # Update only one partition from bare values in its Variables' places.
    selected = filter_tree(tree, CollectionIs("params"))
    update(selected, jax.tree.map(lambda v: jnp.zeros(()), deref(selected)))
    assert float(r1.value) == 0.0 and float(r2.value) == pytest.approx(1.9)


def test_update_with_a_mismatched_source_changes_nothing():
    a, b = Variable(jnp.array(1.0)), Variable(jnp.array(2.0))
    with pytest.raises(ValueError, match="source has 1 places for values but the target has 2"):
        update([a, b], [jnp.array(5.0)])
    assert float(a.value) == 1.0 and float(b.value) == 2.0


def test_reref_needs_the_whole_tree():
    shared = Variable(1.0)
    plain = deref([shared, shared])
    with pytest.raises(ValueError, match="comes before the VariableValue"):
        reref([plain[1], plain[0]])
