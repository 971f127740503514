"""pytree_module: classes whose instances are JAX pytrees."""

from .__about__ import __version__ as __version__
from ._abstract import AbstractClassVar as AbstractClassVar
from ._abstract import AbstractVar as AbstractVar
from ._check import check_module as check_module
from ._containers import Dict as Dict
from ._containers import List as List
from ._dataclass import dataclass as dataclass
from ._enumeration import Enumeration as Enumeration
from ._errors import TraceContextError as TraceContextError
from ._field import Data as Data
from ._field import Static as Static
from ._field import field as field
from ._module import Module as Module
from ._partial import Partial as Partial
from ._pformat import tree_pformat as tree_pformat
from ._pformat import tree_pprint as tree_pprint
from ._status import data as data
from ._status import is_data as is_data
from ._status import register_data_type as register_data_type
from ._status import static as static
from ._tree_at import tree_at as tree_at
from ._tree_equal import tree_equal as tree_equal
from ._tree_structure import tree_check as tree_check
from ._tree_structure import tree_flatten_one_level as tree_flatten_one_level
