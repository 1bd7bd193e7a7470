"""Math for score and mask mods: ``from attncompiler import ops`` (see :mod:`attncompiler.spec.ops`)."""
from .spec.ops import *  # noqa: F401,F403
from .spec.ops import __all__  # noqa: F401
