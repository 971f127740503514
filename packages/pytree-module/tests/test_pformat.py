"""repr, tree_pformat, tree_pprint and treescope rendering."""

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Module, field, tree_pformat, tree_pprint


class Linear(Module):
    def __init__(self):
        self.weight = jnp.zeros((3, 4))
        self.features = 4


class Hidden(Module):
    shown: int
    secret: int = field(repr=False, default=0)


def test_repr_is_compact_with_short_arrays():
    assert repr(Linear()) == "Linear(features=4, weight=f32[3,4])"
    assert repr(Hidden(1)) == "Hidden(shown=1)"


def test_nested_repr_breaks_lines_when_too_wide():
    class Big(Module):
        def __init__(self):
            self.layers = [Linear() for _ in range(4)]

    text = tree_pformat(Big(), width=40)
    assert text.startswith("Big(\n  layers=[")
    assert text.count("f32[3,4]") == 4


def test_long_arrays_and_pprint(capsys):
    assert "Array(" in tree_pformat(jnp.ones(2), short_arrays=False)
    tree_pprint({"a": jnp.ones((2, 2), dtype=jnp.int32)})
    assert capsys.readouterr().out.strip() == "{'a': i32[2,2]}"


def test_treescope_renders_modules():
    treescope = pytest.importorskip("treescope")
    html = treescope.render_to_text(Linear())
    assert "Linear" in html and "weight" in html and "features" in html


def test_prng_keys_print_as_their_key_type():
    import jax

    from pytree_module import tree_pformat

    assert tree_pformat(jax.random.key(0)) == "key<fry>[]"
    assert tree_pformat({"k": jax.random.split(jax.random.key(0), 3)}) == "{'k': key<fry>[3]}"


def test_functions_with_custom_derivatives_show_their_name():
    # jax.nn.relu is a jax.custom_jvp object, not a function.
    tree = {"activation": jax.nn.relu, "plain": jnp.tanh}
    text = tree_pformat(tree)
    assert "<function relu>" in text
    assert "custom_jvp object" not in text
    assert "<function relu>" in tree_pformat(tree, short_arrays=False)
