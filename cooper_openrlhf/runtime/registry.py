"""Choices by name: one small registry, at the lowest layer so that every layer can look its choices up in it.

Every variant this package picks by name (a dtype, a model, a benchmark, a reward form, a negative source, a
hacking rule, an engine kind, a service mode, ...) is looked up in a `Registry`, modelled on verl's
`POLICY_LOSS_REGISTRY` / `get_policy_loss_fn` (verl/trainer/ppo/core_algos.py): entries are registered by name
(`register` as a decorator, or given at construction), and a lookup of a name it lacks raises a ValueError that
lists the valid ones, the same sentence everywhere. A registry iterates over its names in registration order, so it
serves as argparse `choices` too. No torch, no imports from this package: the launchers' checks read it without
loading a model library.
"""

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """name -> T. `registry[name]` / `check(name)` raise ValueError("unknown <what> 'x'; valid: [...]").

    what: how the error names the choice (a flag such as "--cooper.negative_source", or "reward form").
    entries: a mapping of name -> value, or an iterable of bare names (a choice that selects behaviour written
        elsewhere; the value is the name itself).
    error: the ValueError subclass an unknown name raises, where callers catch a module's own (`DtypeError`).
    """

    def __init__(self, what: str, entries: Mapping[str, T] | Iterable[str] = (), error: type[ValueError] = ValueError):
        self.what = what
        self.error = error
        self._entries: dict[str, T] = {}
        for name, value in (entries.items() if isinstance(entries, Mapping) else ((n, n) for n in entries)):
            self.add(name, value)

    def add(self, name: str, value: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._entries[name] = value
        return value

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: `@REGISTRY.register("name")` over a function or class adds it under `name`."""
        return lambda value: self.add(name, value)

    def check(self, name: str) -> str:
        """`name` when it is registered, else the ValueError listing the valid names."""
        if name not in self._entries:
            raise self.error(f"unknown {self.what} {name!r}; valid: {list(self._entries)}")
        return name

    def __getitem__(self, name: str) -> T:
        return self._entries[self.check(name)]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def items(self):
        return self._entries.items()

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {list(self._entries)})"
