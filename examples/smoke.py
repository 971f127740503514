"""Smoke run: import the five packages, print their versions, run one small JAX computation."""

import jax
import jax.numpy as jnp

import pytree_filter
import pytree_graph
import pytree_module
import pytree_nn
import pytree_transforms

PACKAGES = (pytree_filter, pytree_module, pytree_transforms, pytree_graph, pytree_nn)


def main() -> None:
    for package in PACKAGES:
        print(f"{package.__name__:<18} {package.__version__}")

    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    x = jnp.linspace(-1.0, 1.0, 2)
    loss = jax.jit(lambda p, x: jnp.sum(jnp.tanh(x @ p["w"] + p["b"]) ** 2))
    print(f"jax {jax.__version__} on {jax.default_backend()}: loss = {loss(params, x):.4f}")
    grads = jax.grad(loss)(params, x)
    print("grad norms:", {name: f"{jnp.linalg.norm(g):.4f}" for name, g in grads.items()})


if __name__ == "__main__":
    main()
