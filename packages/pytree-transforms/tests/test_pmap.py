"""filter_pmap across (fake) CPU devices."""

import gc
import weakref

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Module
from pytree_transforms import filter_pmap, if_array

N = jax.local_device_count()


def test_split_broadcast_and_static():
    traces = []

    @filter_pmap(args=(0, None))
    def f(x, y, scale):
        traces.append(1)
        return x * y * scale, "done"

    out, label = f(jnp.ones((N, 3)), jnp.full(3, 2.0), 3)
    assert out.shape == (N, 3) and float(out[0, 0]) == 6.0 and label == "done"
    f(jnp.ones((N, 3)), jnp.full(3, 2.0), 3)
    assert len(traces) == 1  # cached
    f(jnp.ones((N, 3)), jnp.full(3, 2.0), 4)
    assert len(traces) == 2  # static input changed


def test_collectives_and_modules():
    class Scale(Module):
        def __init__(self):
            self.s = jnp.full((N,), 2.0)
            self.label = "scale"

    @filter_pmap(axis_name="devices")
    def mean_scaled(model, x):
        return jax.lax.pmean(model.s * x, "devices")

    out = mean_scaled(Scale(), jnp.arange(float(N)))
    assert jnp.allclose(out, jnp.full(N, 2.0 * (N - 1) / 2))


@pytest.mark.skipif(N < 2, reason="needs several devices")
def test_several_devices():
    out = filter_pmap(lambda x: x + jax.lax.axis_index("i"), axis_name="i")(jnp.zeros(N))
    assert out.tolist() == list(range(N))


def test_no_mapped_input_with_axis_size():
    out = filter_pmap(lambda x: x * 2, in_axes=None, axis_size=1)(jnp.ones(2))
    assert out.shape == (1, 2) and out.tolist() == [[2.0, 2.0]]
    assert filter_pmap(lambda: 1.5, axis_size=1, out_axes=0)().tolist() == [1.5]


def test_outputs_given_an_axis_are_broadcast_along_it():
    out = filter_pmap(lambda x: (x, 1.5, jnp.ones(2)), out_axes=0)(jnp.ones(N))
    assert out[1].tolist() == [1.5] * N and out[2].shape == (N, 2)


def test_wrappers_around_one_function_share_compilations():
    traces = []

    def double(x):
        traces.append(1)
        return x * 2

    for _ in range(3):
        assert filter_pmap(double)(jnp.ones(N)).tolist() == [2.0] * N
    assert len(traces) == 1
    filter_pmap(double, out_axes=if_array(0))(jnp.ones(N))  # an equal `out_axes`
    assert len(traces) == 1
    filter_pmap(double, axis_name="i")(jnp.ones(N))  # other options: compiled again
    assert len(traces) == 2
    for _ in range(2):
        filter_pmap(double, devices=jax.local_devices()[:N])(jnp.ones(N))
    assert len(traces) == 3

    class Unhashable:
        __hash__ = None

        def __call__(self, leaf):
            return 0

    # Options that cannot key a cache get a cache per wrapper.
    for _ in range(2):
        filter_pmap(double, out_axes=Unhashable())(jnp.ones(N))
    assert len(traces) == 5


def test_a_new_instance_of_a_module_as_the_function_compiles_once():
    traces = []

    class Scale(Module):
        def __init__(self, w, name="scale"):
            self.w = w
            self.name = name

        def __call__(self, x):
            traces.append(1)
            return self.w * x

    for w in (1.0, 2.0, 3.0):  # the model after each update: a new instance
        out = filter_pmap(Scale(jnp.asarray(w)))(jnp.ones(N))
        assert out.tolist() == [w] * N  # its own arrays, not the first's
    assert len(traces) == 1
    filter_pmap(Scale(jnp.asarray(1.0), name="other"))(jnp.ones(N))  # another static part
    assert len(traces) == 2
    model = Scale(jnp.ones(()))
    ref = weakref.ref(model)
    filter_pmap(model)(jnp.ones(N))
    del model
    gc.collect()
    assert ref() is None  # the shared compilations keep no instance alive


def test_compilation_cache_does_not_keep_the_function_alive():
    def double(x):
        return x * 2

    wrapper = filter_pmap(double)
    wrapper(jnp.ones(N))
    ref = weakref.ref(double)
    del double, wrapper
    gc.collect()
    assert ref() is None


def test_errors():
    with pytest.raises(TypeError, match="static_broadcasted_argnums"):
        filter_pmap(lambda x: x, static_broadcasted_argnums=0)
    with pytest.raises(TypeError, match="expects a function"):
        filter_pmap(3)
    with pytest.raises(ValueError, match="number of devices to run on is unknown"):
        filter_pmap(lambda x: x, in_axes=None)(jnp.ones(2))
    with pytest.raises(TypeError, match=r"axis_size=\.\.\.\) must be a positive int"):
        filter_pmap(lambda x: x, axis_size=0)
    with pytest.raises(
        ValueError, match=r"args\[0\] is an array of shape \(\), which has no axis 0"
    ):
        filter_pmap(lambda x: x)(jnp.array(1.0))


def test_in_axes_by_parameter_name():
    f = filter_pmap(lambda x, y: x * y, in_axes=dict(y=None))
    out = f(jnp.ones((N, 2)), jnp.array([2.0, 3.0]))
    assert out.shape == (N, 2) and out[0].tolist() == [2.0, 3.0]
    assert f(y=jnp.array([2.0, 3.0]), x=jnp.ones((N, 2))).shape == (N, 2)
    with pytest.raises(ValueError, match=r"names 'z', which is not a parameter of <lambda>\(x\)"):
        filter_pmap(lambda x: x, in_axes=dict(z=None))


def on_devices(*shape):
    """Arrays split across the devices already, as the outputs of a `filter_pmap` are:
    `jax.pmap` can reuse their buffers."""
    return filter_pmap(lambda x: x)(jnp.ones((N, *shape)))


# The calls after the first warn again, of the buffers of `grads`.
@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
def test_donated_buffers_are_deleted():
    @filter_pmap(donate="all")
    def step(state, grads, name):
        return jax.tree.map(lambda s, g: s - g, state, grads), name

    state, grads = {"w": on_devices(3), "b": on_devices()}, {"w": on_devices(3), "b": on_devices()}
    # Two outputs reuse two of the four donated buffers; JAX warns of the others.
    with pytest.warns(UserWarning, match="Some donated buffers were not usable"):
        new_state, name = step(state, grads, "step")
    assert name == "step" and new_state["w"].tolist() == [[0.0] * 3] * N
    assert state["w"].is_deleted() and state["b"].is_deleted()
    assert not grads["w"].is_deleted()
    # An array on one device only is copied to the others first: it stays as it was (with a
    # single device it is where pmap needs it already, and is donated as the rest).
    host = jnp.ones((N, 3))
    step({"w": host, "b": on_devices()}, {"w": on_devices(3), "b": on_devices()}, "step")
    assert host.is_deleted() == (N == 1)


def test_donating_all_but_the_first_argument():
    for donate in ("all-except-first", "warn-except-first"):
        f = filter_pmap(lambda x, y: x + y, donate=donate)
        x, y = on_devices(2), on_devices(2)
        assert f(x, y).tolist() == [[2.0, 2.0]] * N
        assert not x.is_deleted() and y.is_deleted()
    x, y = on_devices(2), on_devices(2)
    filter_pmap(lambda x, y: x + y, donate="none")(x, y)
    assert not x.is_deleted() and not y.is_deleted()


def test_donating_an_array_passed_twice():
    # XLA refuses a buffer donated at two places: it is passed, and donated, once.
    f = filter_pmap(lambda x, y: x * y, donate="all")
    x = on_devices(2)
    assert f(x, x).tolist() == [[1.0, 1.0]] * N and x.is_deleted()
    # Kept at one place (the first argument), it is kept at both.
    g = filter_pmap(lambda x, y: x * y, donate="all-except-first")
    x = on_devices(2)
    assert g(x, x).tolist() == [[1.0, 1.0]] * N and not x.is_deleted()
    square = on_devices(N)
    with pytest.raises(ValueError, match=r"different axes \(0 and 1, at the leaf at args\[1\]\)"):
        filter_pmap(lambda x, y: x, in_axes=(0, 1), donate="all")(square, square)


def test_lower_and_compile():
    traces = []

    @filter_pmap(donate="all")
    def f(x, scale):
        traces.append(1)
        return x * scale, "scaled"

    lowered = f.lower(on_devices(2), 3)
    assert "multiply" in lowered.as_text()
    assert isinstance(lowered.lowered, jax.stages.Lowered)
    compiled = lowered.compile()
    x = on_devices(2)
    out, label = compiled(x, 3)
    assert label == "scaled" and out.tolist() == [[3.0, 3.0]] * N and x.is_deleted()
    assert len(traces) == 1
    with pytest.raises(ValueError, match="lowered for arguments of another structure"):
        compiled(on_devices(2), 4)
    with pytest.raises(TypeError):
        compiled(on_devices(5), 3)  # another shape: refused by JAX
    # Without donation, and with `axis_size` (no mapped input).
    lowered = filter_pmap(lambda x: x * 2, in_axes=None, axis_size=1).lower(jnp.ones(2))
    assert lowered.compile()(jnp.ones(2)).tolist() == [[2.0, 2.0]]


def test_donate_errors():
    with pytest.raises(ValueError, match=r"filter_pmap\(donate=\.\.\.\) must be one of 'none'"):
        filter_pmap(lambda x: x, donate="arrays")
    with pytest.raises(TypeError, match="filter_pmap takes no donate_argnums"):
        filter_pmap(lambda x: x, donate_argnums=(0,))
