"""pytree_transforms: JAX transforms for functions of any pytrees (filtered transforms)."""

from . import debug as debug
from .__about__ import __version__ as __version__
from ._ad import filter_grad as filter_grad
from ._ad import filter_hessian as filter_hessian
from ._ad import filter_jacfwd as filter_jacfwd
from ._ad import filter_jacrev as filter_jacrev
from ._ad import filter_jvp as filter_jvp
from ._ad import filter_value_and_grad as filter_value_and_grad
from ._ad import filter_vjp as filter_vjp
from ._axes import if_array as if_array
from ._caches import clear_caches as clear_caches
from ._callback import filter_pure_callback as filter_pure_callback
from ._checkpoint import filter_checkpoint as filter_checkpoint
from ._closure import filter_closure_convert as filter_closure_convert
from ._custom_jvp import filter_custom_jvp as filter_custom_jvp
from ._custom_vjp import filter_custom_vjp as filter_custom_vjp
from ._jit import filter_jit as filter_jit
from ._nondifferentiable import nondifferentiable as nondifferentiable
from ._nondifferentiable import nondifferentiable_backward as nondifferentiable_backward
from ._pmap import filter_pmap as filter_pmap
from ._shapes import filter_eval_shape as filter_eval_shape
from ._shapes import filter_make_jaxpr as filter_make_jaxpr
from ._shard import filter_shard as filter_shard
from ._updates import apply_updates as apply_updates
from ._vmap import filter_vmap as filter_vmap
