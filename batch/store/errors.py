"""The store's own errors: nothing outside batch/store/ sees (or imports) duckdb's.

`StoreError` is what any store operation raises when the database fails (a bad user
query, a full disk, a read-only file written to); `StoreOpenError` when a file cannot
be opened as a batchrun database at all.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from types import FunctionType
from typing import Any, TypeVar

import duckdb

T = TypeVar("T")


class StoreError(RuntimeError):
    """The database failed an operation; the message is DuckDB's."""


class StoreOpenError(StoreError):
    """The file cannot be used as a batchrun database; the message is one line that names
    the file and what to do."""


class StoreLockedError(StoreOpenError):
    """Another process holds DuckDB's lock on the file (DuckDB allows one writer)."""

    def __init__(self, message: str, holder_pid: int | None = None):
        super().__init__(message)
        self.holder_pid = holder_pid  # as DuckDB names it


def store_error(error: BaseException) -> BaseException:
    """``error`` as the store raises it: a duckdb error becomes a StoreError with its message."""
    if isinstance(error, duckdb.Error):
        translated = StoreError(str(error))
        translated.__cause__ = error
        return translated
    return error


def _translating(method: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def generator(*args: Any, **kwargs: Any) -> Iterator[Any]:
            try:
                yield from method(*args, **kwargs)
            except duckdb.Error as error:
                raise store_error(error) from error
        return generator

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except duckdb.Error as error:
            raise store_error(error) from error
    return call


def raising_store_errors(cls: type[T]) -> type[T]:
    """Every public method of ``cls`` (inherited ones too) raises StoreError for a duckdb error."""
    for name in dir(cls):
        if name.startswith("_"):
            continue
        method = inspect.getattr_static(cls, name)
        if isinstance(method, FunctionType):
            setattr(cls, name, _translating(method))
    return cls
