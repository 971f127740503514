"""closure_to_pytree: a closure's captured values become leaves, so filter_jit traces them;
and filter_closure_convert's in_struct/out_struct."""

import gc
import inspect
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_transforms import closure_to_pytree, filter_closure_convert, filter_grad, filter_jit


def _make_update(lr, offset=0.0):
    rate = jnp.asarray(lr)

    def update(params, *, sign=1.0):
        return params - sign * rate * params + offset

    return update


def test_captured_values_are_the_leaves_named_by_their_variables():
    update = closure_to_pytree(_make_update(0.5, offset=1.0))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(update)]
    assert paths == ["['offset']", "['rate']"]
    assert update(jnp.ones(2)).tolist() == [1.5, 1.5]
    assert update(jnp.ones(2), sign=-1.0).tolist() == [2.5, 2.5]  # keyword defaults kept
    assert update.__name__ == "update"
    assert list(inspect.signature(update).parameters) == ["params", "sign"]


def test_filter_jit_traces_captured_arrays_instead_of_compiling_them_in():
    traces = []

    @filter_jit
    def apply(update, params):
        traces.append(1)
        return update(params)

    for lr in (0.1, 0.2, 0.3):
        out = apply(closure_to_pytree(_make_update(lr)), jnp.ones(2))
        np.testing.assert_allclose(out, 1 - lr, rtol=1e-6)
    assert len(traces) == 1
    apply(closure_to_pytree(_make_update(0.1, offset=2.0)), jnp.ones(2))  # a new static
    assert len(traces) == 2
    # Without the conversion, each closure is a new static function: traced every time.
    apply(_make_update(0.1), jnp.ones(2))
    apply(_make_update(0.2), jnp.ones(2))
    assert len(traces) == 4


def test_captured_arrays_are_differentiable_leaves():
    update = closure_to_pytree(_make_update(2.0))
    grads = filter_grad(lambda u, x: jnp.sum(u(x)))(update, jnp.ones(3))
    assert grads.contents[1].tolist() == -3.0  # d/d rate of sum(x - rate * x)
    rebuilt = jax.tree.map(lambda x: x * 0, update)
    assert rebuilt(jnp.ones(2)).tolist() == [1.0, 1.0]


def test_conversion_is_recursive_and_reaches_functions_inside_pytrees():
    inner = _make_update(0.5)

    def make_outer():
        scale = jnp.asarray(3.0)

        def outer(x):
            return scale * inner(x)

        return outer

    tree = closure_to_pytree({"opt": (make_outer(), 1), "name": "run"})
    leaves = jax.tree.leaves(tree)
    assert [float(x) for x in leaves if isinstance(x, jax.Array)] == [0.5, 3.0]
    assert tree["opt"][0](jnp.ones(1)).tolist() == [1.5]
    assert tree["name"] == "run" and tree["opt"][1] == 1
    # Converting again changes nothing.
    again = closure_to_pytree(tree)
    assert jax.tree.structure(again) == jax.tree.structure(tree)


def test_functions_from_one_def_share_a_static_part_and_other_defs_do_not():
    a, b = closure_to_pytree(_make_update(0.1)), closure_to_pytree(_make_update(0.2))
    assert jax.tree.structure(a) == jax.tree.structure(b)

    def other(lr):
        rate = jnp.asarray(lr)
        offset = 0.0

        def update(params, *, sign=1.0):
            return params - sign * rate * params + offset

        return update

    assert jax.tree.structure(closure_to_pytree(other(0.1))) != jax.tree.structure(a)


def test_defaults_are_part_of_the_static_part():
    def make(k):
        return lambda x, k=k: x * k

    one, also_one, two = (closure_to_pytree(make(k)) for k in (1.0, 1.0, 2.0))
    assert jax.tree.structure(one) == jax.tree.structure(also_one)
    assert jax.tree.structure(one) != jax.tree.structure(two)
    assert two(3.0) == 6.0


def test_module_level_functions_and_other_leaves_are_unchanged_in_behaviour():
    converted = closure_to_pytree(np.sin)  # not a Python function: left as it is
    assert converted is np.sin
    tanh = closure_to_pytree(_make_update)  # captures nothing: no leaves
    assert jax.tree.leaves(tanh) == []
    assert tanh(1.0)(jnp.ones(1)).tolist() == [0.0]


def test_recursive_and_not_yet_filled_closures():
    def make():
        def countdown(n):
            return 0 if n == 0 else 1 + countdown(n - 1)

        return countdown

    countdown = closure_to_pytree(make())
    assert countdown(4) == 4

    def make_late():
        def read():
            return late

        converted = closure_to_pytree(read)  # `late` is not assigned yet: an empty cell
        late = 1
        return converted, read

    converted, original = make_late()
    assert original() == 1
    with pytest.raises(NameError, match="late"):
        converted()  # as the function would at that point: the cell was empty


def test_a_converted_closure_keeps_no_reference_to_the_original_cells():
    big = jnp.ones(1000)

    def make():
        held = big

        def f():
            return held

        return f

    original = make()
    converted = closure_to_pytree(original)
    code = jax.tree.structure(converted)
    ref = weakref.ref(original)
    del original
    gc.collect()
    assert ref() is None  # the static part does not hold the function
    assert code == jax.tree.structure(closure_to_pytree(make()))


def test_bad_calls_raise_as_the_function_would():
    update = closure_to_pytree(_make_update(0.1))
    with pytest.raises(TypeError, match="update"):
        update()


def test_unhashable_captured_values_are_named_by_filter_jit():
    def make():
        tags = bytearray(b"ab")  # not hashable, so it cannot be static
        return lambda x: x + len(tags)

    with pytest.raises(TypeError, match="tags"):
        filter_jit(lambda f, x: f(x))(closure_to_pytree(make()), 1.0)


def test_closure_convert_exposes_its_input_and_output_structures():
    converted = filter_closure_convert(
        lambda x, tag: ({"y": 2 * x, "tag": tag}, x.astype(jnp.int32)), jnp.ones(3), "t"
    )
    out = converted.out_struct
    assert out[0]["tag"] == "t"
    assert out[0]["y"] == jax.ShapeDtypeStruct((3,), jnp.float32)
    assert out[1] == jax.ShapeDtypeStruct((3,), jnp.int32)
    assert jax.tree.structure(out) == jax.tree.structure(converted(jnp.zeros(3), "t"))
    (x, tag), kwargs = converted.in_struct
    assert (x, tag, kwargs) == (jax.ShapeDtypeStruct((3,), jnp.float32), "t", {})
