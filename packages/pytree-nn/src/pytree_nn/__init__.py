"""pytree_nn: neural-network layers, Rngs, Optimizer and checkpoints on the pytree packages."""

from . import initializers as initializers
from .__about__ import __version__ as __version__
from ._combinators import Lambda as Lambda
from ._combinators import Sequential as Sequential
from ._dropout import Dropout as Dropout
from ._linear import MLP as MLP
from ._linear import Linear as Linear
from ._module import Module as Module
from ._rngs import RngCount as RngCount
from ._rngs import RngKey as RngKey
from ._rngs import Rngs as Rngs
from ._rngs import RngStream as RngStream
