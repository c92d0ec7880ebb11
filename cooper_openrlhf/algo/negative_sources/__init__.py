"""Negative sources: where a Cooper pair's negative comes from, one registered strategy per module.

`NEGATIVE_SOURCES[name]` is the source (`base.NegativeSource`); an unknown name fails listing the valid ones. Every
module of this package but `base` is a source and is imported here, so a new source is one new module (and its
test): it registers itself with `@register`. They are imported by module name, the order `--cooper.negative_source`
lists them in.
"""

import importlib
import pkgutil

from cooper_openrlhf.algo.negative_sources.base import (FROM_ASSISTANT, FROM_NONE, FROM_ROLLOUT, NEGATIVE_SOURCES,
                                                        NegativeSource, register)

__all__ = ["FROM_ASSISTANT", "FROM_NONE", "FROM_ROLLOUT", "NEGATIVE_SOURCES", "NegativeSource", "register"]

for _name in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"):
    importlib.import_module(f"{__name__}.{_name}")
