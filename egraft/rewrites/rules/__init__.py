"""The rule families.  Each module here exports ``RULES: list[RuleSpec]``; this list is the registry.

A family is the prefix of its rules' names (``algebra.mul-one``); one family
may span modules (``models`` is :mod:`.models_scale` and :mod:`.models_weights`).
Add a module by importing it here: a misspelt or missing module is an ImportError.
:mod:`.match` is not a family: it holds the matchers the idiom and model rules share.
"""

from . import algebra, idioms, models_scale, models_weights, reductions, state, views

MODULES = (algebra, views, reductions, idioms, models_scale, models_weights, state)
