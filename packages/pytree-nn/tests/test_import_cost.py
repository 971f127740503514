"""What `import pytree_nn` imports: none of the optional or heavy libraries that only some
uses need (optax, checkpoint formats, reprs, progress bars), each of them imported on first
use instead. A behaviour test, in a fresh interpreter; the time itself is measured by
benchmarks/bench_import.py."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

# Libraries that `import pytree_nn` (and so `import pytree_graph`, `pytree_transforms`,
# `pytree_module`) must not import. absl comes with optax.
LAZY = ("optax", "absl", "safetensors", "orbax", "treescope", "wadler_lindig", "tqdm", "rich")


def _run(code: str) -> dict:
    """Run `code` in a fresh interpreter (this one's path) and return the JSON it prints."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _loaded(names: tuple[str, ...]) -> str:
    """Code for the sorted list of the libraries of `names` that are imported."""
    return f"sorted({{m.split('.')[0] for m in sys.modules}} & {set(names)!r})"


@pytest.mark.parametrize("package", ["pytree_nn", "pytree_graph", "pytree_module"])
def test_import_leaves_optional_libraries_unimported(package: str) -> None:
    loaded = _run(f"""
        import json, sys
        import {package}
        print(json.dumps({_loaded(LAZY)}))
    """)
    assert loaded == []


def test_optional_libraries_are_imported_on_first_use() -> None:
    # In a fresh interpreter, so that no other test has imported them already: each use
    # works from a bare `import pytree_nn`, importing what it needs then.
    steps = _run(f"""
        import json, os, sys, tempfile
        import jax.numpy as jnp
        import pytree_graph as pg
        import pytree_nn as nn
        steps = {{}}
        model = nn.Linear(2, 1, rngs=0)
        repr(model)
        steps["repr"] = {_loaded(("wadler_lindig",))}
        path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
        nn.save_checkpoint(path, model)
        nn.load_checkpoint(path, nn.Linear(2, 1, rngs=1))
        steps["checkpoint"] = {_loaded(("safetensors",))}
        steps["before optax"] = {_loaded(("optax",))}
        import optax
        optimizer = nn.Optimizer(model, optax.sgd(0.05))
        grads = pg.grad(lambda m: jnp.sum(m(jnp.ones((1, 2))) ** 2))(model)
        before = float(jnp.sum(model(jnp.ones((1, 2))) ** 2))
        optimizer.update(model, grads)
        steps["loss fell"] = float(jnp.sum(model(jnp.ones((1, 2))) ** 2)) < before
        graphdef, params = pg.split(model, pg.Param)
        state = nn.TrainState.create(graphdef, params=params, tx=optax.sgd(0.05))
        steps["train state step"] = int(state.apply_gradients(grads=grads).step)
        print(json.dumps(steps))
    """)
    assert steps["repr"] == ["wadler_lindig"]
    assert steps["checkpoint"] == ["safetensors"]
    assert steps["before optax"] == []
    assert steps["loss fell"] is True
    assert steps["train state step"] == 1
