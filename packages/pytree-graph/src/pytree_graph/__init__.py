"""pytree_graph: Variables and object graphs for JAX, with sharing kept across transforms."""

from .__about__ import __version__ as __version__
from ._graphdef import GraphDef as GraphDef
from ._refs import VariableIndex as VariableIndex
from ._refs import VariableValue as VariableValue
from ._refs import deref as deref
from ._refs import reref as reref
from ._sharding import get_named_sharding as get_named_sharding
from ._sharding import get_partition_spec as get_partition_spec
from ._split_merge import clone as clone
from ._split_merge import graphdef as graphdef
from ._split_merge import merge as merge
from ._split_merge import pop as pop
from ._split_merge import split as split
from ._split_merge import state as state
from ._split_merge import update as update
from ._state import State as State
from ._traverse import find_duplicates as find_duplicates
from ._traverse import iter_graph as iter_graph
from ._variables import BatchStat as BatchStat
from ._variables import Cache as Cache
from ._variables import Intermediate as Intermediate
from ._variables import Param as Param
from ._variables import Perturbation as Perturbation
from ._variables import Variable as Variable
