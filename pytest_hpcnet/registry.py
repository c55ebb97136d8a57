"""Named classes that third parties may add: launchers (``cluster.launcher``) and targets (``targets``).

One ``Registry`` per kind. A name is given once: registering the same class again is a no-op, another
class under a taken name is refused in one line naming both. Besides the built-in classes, a registry
holds what installed distributions name under its entry point group (loaded once, on first use) and
what a ``conftest.py`` returns from its pytest hook (added for the run, removed after it).
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import ConfigError


def qualname(cls) -> str:
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', repr(cls))}"


class Registry:
    def __init__(self, kind: str, group: str, methods: Sequence[str], hook: str):
        self.kind, self.group, self.methods, self.hook = kind, group, tuple(methods), hook
        self.classes: dict[str, type] = {}
        self._entry_points_loaded = False

    def register(self, cls, origin: str | None = None):
        """Add ``cls`` under ``cls.name`` (usable as a class decorator); ``origin`` says where the
        newcomer came from in the error."""
        name = getattr(cls, "name", None)
        where = origin or qualname(cls)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a {self.kind} needs a non-empty string class attribute 'name', "
                              f"{qualname(cls)} has {name!r}", where)
        missing = [m for m in self.methods if not callable(getattr(cls, m, None))]
        if missing:
            raise ConfigError(f"{self.kind} {name!r} ({qualname(cls)}) lacks "
                              f"{', '.join(f'{m}()' for m in missing)}", where)
        taken = self.classes.get(name)
        if taken is not None and taken is not cls:
            raise ConfigError(f"{self.kind} name {name!r} is taken by {qualname(taken)}; "
                              f"refusing {qualname(cls)}", where)
        self.classes[name] = cls
        return cls

    def unregister(self, cls) -> None:
        """Remove ``cls`` if it is the class registered under its name (a plugin going away)."""
        if self.classes.get(getattr(cls, "name", None)) is cls:
            del self.classes[cls.name]

    def load_entry_points(self, entry_points=None) -> list[type]:
        """Register every class the installed distributions name under the group (``name =
        "module:Class"``; the entry point's name must be the class's ``name``). Returns them."""
        from importlib import metadata
        found = []
        eps = metadata.entry_points(group=self.group) if entry_points is None else entry_points
        for ep in eps:
            where = f"entry point {ep.name} = {ep.value} (group {self.group})"
            try:
                cls = ep.load()
            except Exception as e:  # a broken third-party package: say which, in one line
                raise ConfigError(f"cannot load: {type(e).__name__}: {e}", where) from None
            if getattr(cls, "name", None) != ep.name:
                raise ConfigError(f"names {self.kind} {getattr(cls, 'name', None)!r}; the entry point's name "
                                  f"must be the {self.kind}'s name", where)
            found.append(self.register(cls, where))
        return found

    def register_from_hook(self, results, where: str | None = None) -> list[type]:
        """Register what implementations of the pytest hook returned (one list of classes each);
        returns the classes newly added, for ``unregister`` when the run ends."""
        added = []
        for classes in results:
            for cls in classes or ():
                if self.classes.get(getattr(cls, "name", None)) is not cls:
                    added.append(self.register(cls, where or self.hook))
        return added

    def known(self) -> dict[str, type]:
        """Every class: the built-in ones, those registered so far, and (once) the entry points'."""
        if not self._entry_points_loaded:
            self._entry_points_loaded = True
            self.load_entry_points()
        return self.classes
