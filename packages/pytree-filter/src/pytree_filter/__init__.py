"""pytree_filter: predicates, filter/partition/combine and composable filter objects."""

from .__about__ import __version__ as __version__
from ._filters import All as All
from ._filters import Any as Any
from ._filters import Everything as Everything
from ._filters import Filter as Filter
from ._filters import Not as Not
from ._filters import Nothing as Nothing
from ._filters import OfType as OfType
from ._filters import PathContains as PathContains
from ._filters import WithTag as WithTag
from ._filters import to_predicate as to_predicate
from ._partition import combine as combine
from ._partition import filter as filter
from ._partition import flatten_with_mask as flatten_with_mask
from ._partition import partition as partition
from ._paths import Path as Path
from ._paths import path_keys as path_keys
from ._paths import path_text as path_text
from ._predicates import ARRAY_TYPES as ARRAY_TYPES
from ._predicates import SHAPED_TYPES as SHAPED_TYPES
from ._predicates import is_array as is_array
from ._predicates import is_array_like as is_array_like
from ._predicates import is_inexact_array as is_inexact_array
from ._predicates import is_inexact_array_like as is_inexact_array_like
