"""filter_jit: the seed's examples, retracing, asynchronous dispatch, donation, errors."""

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_module import Module, field
from pytree_transforms import filter_jit


def test_seed_examples():
    @filter_jit
    def f(x, y):  # both args traced if arrays, static if non-arrays
        return x + y

    @filter_jit(kwargs=dict(x=False))
    def g(x, y):  # x held static; y is traced if array, static if non-array
        return x + y

    @filter_jit(args=(True,))
    def h(x):
        return x

    @filter_jit
    def apply(f, x):
        return f(x)

    assert int(f(jnp.array(1), jnp.array(2))) == 3  # both args traced
    assert int(f(jnp.array(1), 2)) == 3  # first arg traced, second arg static
    assert f(1, 2) == 3  # both args static: computed at trace time, returned as is
    assert int(g(1, jnp.array(2))) == 3
    assert g(1, 2) == 3
    assert isinstance(h(1), jax.Array)  # traced
    assert isinstance(h(jnp.array(1)), jax.Array)
    with pytest.raises(TypeError, match=r"args\[0\] is marked to be traced.*str 'hi'"):
        h("hi")  # not a trace-able JAX type, so error
    assert int(apply(lambda x: x + 1, jnp.array(1))) == 2


def test_static_arguments_are_static_and_traced_ones_traced():
    seen = []

    @filter_jit
    def f(x, n):
        seen.append((type(x), type(n)))
        return x * n

    f(jnp.ones(2), 3)
    assert issubclass(seen[0][0], jax.core.Tracer) and seen[0][1] is int


def test_kwargs_spec_applies_by_position_and_by_keyword():
    seen = []

    @filter_jit(kwargs=dict(x=True))
    def f(x, y):
        seen.append(isinstance(x, jax.core.Tracer))
        return x + y

    f(1, jnp.ones(1))
    f(x=2, y=jnp.ones(1))
    assert seen == [True, True]


def test_equal_static_inputs_never_retrace_and_changed_ones_always_do(counting):
    fun, traces = counting(lambda x, n, name: x * n)
    f = filter_jit(fun)
    f(jnp.ones(2), 2, "a")
    f(jnp.zeros(2), 2, "a")
    f(jnp.ones(2), 2, "a")
    assert len(traces) == 1
    f(jnp.ones(2), 3, "a")
    assert len(traces) == 2
    f(jnp.ones(2), 3, "b")
    assert len(traces) == 3
    f(jnp.ones(3), 3, "b")  # new shape
    assert len(traces) == 4
    f(jnp.ones(3), 3, "b")
    assert len(traces) == 4


def test_python_scalars_nested_anywhere_are_static(counting):
    fun, traces = counting(lambda d, flag: (d["x"] * d["scale"], d["scale"], flag))
    f = filter_jit(fun)
    y, scale, flag = f({"x": jnp.ones(2), "scale": 2.0}, True)
    assert y.tolist() == [2.0, 2.0]
    # Held static, so returned as the very Python objects, not as arrays.
    assert type(scale) is float and flag is True
    f({"x": jnp.zeros(2), "scale": 2.0}, True)
    assert len(traces) == 1
    f({"x": jnp.zeros(2), "scale": 3.0}, True)
    assert len(traces) == 2


def test_python_bool_flags_drive_python_control_flow():
    @filter_jit
    def f(x, training):
        if training:  # a Python bool: static, so this is plain Python
            return x * 0.5
        return x

    assert f(jnp.ones(1), True).tolist() == [0.5]
    assert f(jnp.ones(1), False).tolist() == [1.0]
    assert f(jnp.ones(1), training=True).tolist() == [0.5]


def test_array_calls_stay_cached_after_calls_with_static_arguments(counting):
    # Calls with only arrays and calls with static values interleave without retracing.
    fun, traces = counting(lambda x, name=None: x + 1)
    f = filter_jit(fun)
    f(jnp.ones(2))
    f(jnp.ones(2), name="a")
    f(jnp.ones(2), "a")
    assert len(traces) == 3  # keyword and positional calls are distinct structures
    for _ in range(3):
        f(jnp.zeros(2))
        f(jnp.zeros(2), name="a")
        f(jnp.zeros(2), "a")
    assert len(traces) == 3
    f(jnp.ones(2), name="b")
    assert len(traces) == 4


def test_weakly_typed_arrays_are_traced(counting):
    fun, traces = counting(lambda x: x * 2)
    f = filter_jit(fun)
    weak = jnp.asarray(1.0)
    assert weak.weak_type
    assert isinstance(f(weak), jax.Array)
    f(jnp.asarray(2.0))
    assert len(traces) == 1


def test_changes_to_a_mutable_module_are_seen():
    class Scale(Module):
        def __init__(self):
            self.factor = jnp.array(2.0)

        def __call__(self, x):
            return x * self.factor

    model = Scale()
    f = filter_jit(model)
    assert f(jnp.ones(1)).tolist() == [2.0]
    model.factor = jnp.array(3.0)
    assert f(jnp.ones(1)).tolist() == [3.0]
    model.factor = 4.0  # now a static float: the call retraces with it
    assert f(jnp.ones(1)).tolist() == [4.0]


class Linear(Module):
    def __init__(self, din, dout, key):
        self.weight = jax.random.normal(key, (din, dout))
        self.bias = jnp.zeros(dout)
        self.activation = jax.nn.relu

    def __call__(self, x):
        return self.activation(x @ self.weight + self.bias)


def test_modules_bound_methods_and_callable_pytrees():
    model = Linear(2, 3, jax.random.key(0))
    expected = model(jnp.ones(2))
    assert jnp.allclose(filter_jit(lambda m, x: m(x))(model, jnp.ones(2)), expected)
    assert jnp.allclose(filter_jit(model)(jnp.ones(2)), expected)
    assert jnp.allclose(filter_jit(model.__call__)(jnp.ones(2)), expected)


def test_function_arrays_are_traced_not_baked_in(counting):
    fun, traces = counting(lambda m, x: m(x))
    f = filter_jit(fun)
    a, b = Linear(2, 3, jax.random.key(0)), Linear(2, 3, jax.random.key(1))
    ya, yb = f(a, jnp.ones(2)), f(b, jnp.ones(2))
    assert len(traces) == 1
    assert not jnp.allclose(ya, yb)


def test_equinox_style_module_with_callable_field():
    class Mlp(Module):
        layers: list
        activation: Callable
        bias: jax.Array

        def __call__(self, x):
            for w in self.layers:
                x = self.activation(x @ w)
            return x + self.bias

    model = Mlp([jnp.eye(2), jnp.eye(2)], jax.nn.relu, jnp.ones(2))
    assert filter_jit(lambda m, x: m(x))(model, jnp.ones(2)).tolist() == [2.0, 2.0]


def test_outputs_can_be_any_pytree():
    @filter_jit
    def f(x):
        return {"y": x + 1, "name": "out", "fn": jnp.sin, "n": 3}

    out = f(jnp.ones(2))
    assert out["name"] == "out" and out["fn"] is jnp.sin and out["n"] == 3
    assert isinstance(out["y"], jax.Array)

    @filter_jit
    def make(key):
        return Linear(2, 3, key)

    model = make(jax.random.key(0))
    assert isinstance(model, Linear) and model.activation is jax.nn.relu


def test_out_spec():
    @filter_jit(out=False)
    def f(x):
        return 3

    assert f(jnp.ones(1)) == 3
    with pytest.raises(ValueError, match="tracer where the `out=` filter says static"):
        filter_jit(lambda x: x * 2, out=False)(jnp.ones(1))


def test_dispatch_is_asynchronous():
    jax.config.update("jax_cpu_enable_async_dispatch", True)
    x = jnp.ones((1500, 1500))

    @filter_jit
    def slow(x, n):
        for _ in range(n):
            x = jnp.tanh(x @ x) / 1500
        return x

    slow(x, 12).block_until_ready()
    start = time.perf_counter()
    y = slow(x, 12)
    returned = time.perf_counter() - start
    y.block_until_ready()
    finished = time.perf_counter() - start
    assert finished > 4 * returned, (returned, finished)


def test_donation():
    @filter_jit(donate="all")
    def f(x, n):
        return x * n

    x = jnp.ones(3)
    f(x, 2).block_until_ready()
    assert x.is_deleted() or jax.default_backend() == "cpu"

    @filter_jit(donate="all-except-first")
    def g(keep, give):
        return keep + give

    keep, give = jnp.ones(3), jnp.ones(3)
    assert g(keep, give).tolist() == [2.0, 2.0, 2.0]
    assert not keep.is_deleted()


def test_lower_and_compile():
    f = filter_jit(lambda x, n: x * n)
    compiled = f.lower(jnp.ones(2), 3).compile()
    assert compiled(jnp.full(2, 2.0), 3).tolist() == [6.0, 6.0]
    assert "multiply" in f.lower(jnp.ones(2), 3).as_text()
    with pytest.raises(ValueError, match="Lower it again"):
        compiled(jnp.ones(2), 4)


def test_method_decorator():
    class Scaled(Module):
        def __init__(self):
            self.s = jnp.array(2.0)

        @filter_jit
        def apply(self, x):
            return self.s * x

    assert float(Scaled().apply(3.0)) == 6.0


def test_numpy_inputs_are_traced():
    seen = []

    @filter_jit
    def f(x):
        seen.append(isinstance(x, jax.core.Tracer))
        return x

    f(np.ones(2))
    assert seen == [True]


def test_errors():
    with pytest.raises(TypeError, match="expects a callable"):
        filter_jit(3)
    with pytest.raises(ValueError, match="donate"):
        filter_jit(lambda x: x, donate="some")
    with pytest.raises(TypeError, match="does not take static_argnums"):
        filter_jit(lambda x: x, static_argnums=0)
    with pytest.raises(TypeError, match="names \\['z'\\]"):
        filter_jit(lambda x: x, kwargs=dict(z=True))
    with pytest.raises(TypeError, match="must be a tuple"):
        filter_jit(lambda x: x, args=True)

    class Unhashable:
        __hash__ = None

    with pytest.raises(TypeError, match="must be hashable"):
        filter_jit(lambda x, u: x)(jnp.ones(1), Unhashable())


def test_graph_objects_are_refused():
    class Graph(Module, pytree=False):
        def __init__(self):
            self.w = jnp.ones(2)

    with pytest.raises(TypeError, match=r"pytree=False.*pytree_graph"):
        filter_jit(lambda g, x: x)(Graph(), jnp.ones(1))

    class CallableGraph(Graph, pytree=False):
        def __call__(self, x):
            return x * self.w

    with pytest.raises(TypeError, match=r"pytree=False.*pytree_graph"):
        filter_jit(CallableGraph())(jnp.ones(2))


def test_errors_inside_the_function_propagate():
    @filter_jit
    def f(x):
        raise RuntimeError("inside")

    with pytest.raises(RuntimeError, match="inside"):
        f(jnp.ones(1))


@pytest.mark.parametrize("error", [TypeError, ValueError])
def test_type_and_value_errors_inside_the_function_are_raised_once(error, counting):
    # JAX refuses bad inputs with these same exception types: the function's own errors
    # must still come out as they are, after a single trace, with the function's frame.
    def fails(x):
        raise error("bad shapes")

    fun, traces = counting(fails)
    with pytest.raises(error, match="bad shapes") as info:
        filter_jit(fun)(jnp.ones(1))
    assert len(traces) == 1
    assert any(frame.name == "fails" for frame in info.traceback)


def test_frozen_module_field_defaults():
    class Conf(Module, frozen=True):
        scale: float = field(static=True, default=2.0)

        def __call__(self, x):
            return self.scale * x

    assert float(filter_jit(lambda c, x: c(x))(Conf(), jnp.array(1.0))) == 2.0


def test_default_spec_applies_without_per_argument_specs():
    def numbers(leaf):
        return isinstance(leaf, int | jax.Array)

    assert isinstance(filter_jit(lambda x: x, default=numbers)(1), jax.Array)  # traced
    assert filter_jit(lambda x: x, default=False)(1) == 1


@pytest.mark.parametrize("donate", ["all", "all-except-first"])
def test_donating_one_array_passed_twice_donates_it_once(donate):
    @filter_jit(donate=donate)
    def f(first, a, b, pair):
        return a + b + pair[0]["w"] + pair[1]["w"]

    x = jnp.ones(3)
    shared = {"w": x}
    assert f(jnp.zeros(3), x, x, (shared, shared)).tolist() == [4.0] * 3  # both donate x
    y, z = jnp.ones(3), jnp.ones(3)
    assert f(jnp.zeros(3), y, z, ({"w": y}, {"w": z})).tolist() == [4.0] * 3


def test_an_array_also_in_the_first_argument_is_not_donated_by_all_except_first():
    @filter_jit(donate="all-except-first")
    def f(keep, give):
        return keep + give

    x = jnp.ones(3)
    f(x, x).block_until_ready()
    assert not x.is_deleted()
    assert f(x, jnp.ones(3)).tolist() == [2.0] * 3


def test_compile_takes_compiler_options_and_stages_expose_jax_analyses():
    f = filter_jit(lambda x, n: x * n)
    lowered = f.lower(jnp.ones(2), 3)
    compiled = lowered.compile(compiler_options={"xla_backend_optimization_level": 0})
    assert compiled(jnp.full(2, 2.0), 3).tolist() == [6.0, 6.0]
    assert "multiply" in str(lowered.compiler_ir())
    # XLA estimates costs before compiling on CPU; on GPUs only the compiled program has them.
    assert lowered.cost_analysis() is not None or jax.default_backend() != "cpu"
    assert compiled.cost_analysis() is not None and compiled.memory_analysis() is not None
    assert isinstance(lowered.lowered, jax.stages.Lowered)
    assert isinstance(compiled.compiled, jax.stages.Compiled)


def test_lowering_with_donation_and_aliases():
    f = filter_jit(lambda a, b: a + b, donate="all")
    x = jnp.ones(2)
    compiled = f.lower(x, x).compile()  # one buffer, passed once
    y = jnp.ones(2)
    assert compiled(y, y).tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match="Lower it again"):
        compiled(jnp.ones(2), jnp.ones(2))  # two buffers: another program
    assert f.lower(x, y).compile()(jnp.ones(2), jnp.ones(2)).tolist() == [2.0, 2.0]


def branch_on_weight(params, name):
    if params["layers"][1]["w"] > 0:
        return name
    return params


@pytest.mark.parametrize("name", ["static", None])  # the filtered path, the direct path
def test_jax_errors_name_the_users_function_and_argument_paths(name):
    params = {"layers": [jnp.ones(()), {"w": jnp.ones(())}]}
    with pytest.raises(jax.errors.TracerBoolConversionError) as info:
        filter_jit(branch_on_weight)(params, name)
    message = str(info.value)
    assert "function branch_on_weight at" in message
    assert "argument params['layers'][1]['w']" in message


class Dense(Module):
    def __init__(self):
        self.weight = jnp.ones(2)

    def __call__(self, x, scale):
        return float(self.weight[0] * x * scale)


@pytest.mark.parametrize("scale", [2, jnp.ones(())])  # the filtered path, the direct path
def test_jax_errors_name_module_fields_and_call_arguments(scale):
    with pytest.raises(jax.errors.ConcretizationTypeError) as info:
        filter_jit(Dense())(jnp.ones(()), scale)
    message = str(info.value)
    assert "function __call__ at" in message and "test_jit.py" in message
    assert "self.weight" in message
    assert "_traced" not in message and "dynamic" not in message


def test_lowered_program_is_named_after_the_function():
    def scale_by(x, n):
        return x * n

    assert "jit_scale_by" in filter_jit(scale_by).lower(jnp.ones(2), 3).as_text()


def test_calls_alternating_between_structures_never_print_the_inputs():
    """A miss of the last call's plan must not cost an error message printing the tree."""
    printed = []

    class Loud(Module):
        def __init__(self, n):
            self.weights = [jnp.ones(2) for _ in range(n)]

        def __repr__(self):
            printed.append(1)
            return "Loud"

    f = filter_jit(lambda m: sum(w.sum() for w in m.weights))
    small, large = Loud(1), Loud(3)
    for _ in range(5):
        assert float(f(small)) == 2.0 and float(f(large)) == 6.0
    assert printed == []
