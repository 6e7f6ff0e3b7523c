"""Token custody: the contracts a token store satisfies (``_contracts``, whole), and the local default."""

from . import _contracts
from ._contracts import *  # noqa: F403  (the contracts, whole)
from ._group import TokenWrites
from ._local import LocalTokenStore

__all__ = [*_contracts.__all__, "LocalTokenStore", "TokenWrites"]
