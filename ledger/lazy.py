"""``lazy``: a value computed on first access and kept on the instance, without a lock.

``functools.cached_property`` on Python 3.11 takes one lock per property, shared by every
instance of the class: threads that verify different ingest batches then queue on it (it
showed as a third of an API worker's time under concurrent ingest). The values cached here
are pure functions of immutable instances, so two threads computing one at the same time
at worst compute it twice, and both get equal values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class lazy(Generic[T]):
    def __init__(self, func: Callable[[Any], T]) -> None:
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> lazy[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> T | lazy[T]:
        if obj is None:
            return self
        value = self.func(obj)
        # A non-data descriptor: once the instance's dict holds the name, it is read first.
        obj.__dict__[self.name] = value
        return value
