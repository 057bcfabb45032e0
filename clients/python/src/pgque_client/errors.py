"""Typed exceptions for pgque's SQLSTATEs (docs/errors.md).

Every pgque function refuses bad input with a specific SQLSTATE; the client
raises the matching subclass of :class:`PgqueError`, with the original
psycopg error as ``__cause__`` and in ``.pg_error``. Branch on the class (or on
``.sqlstate``), never on the message text.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg


class PgqueError(Exception):
    """A pgque call failed. ``sqlstate`` is PostgreSQL's code, or None for a
    client-side error (e.g. a feature the server does not have)."""

    sqlstate: str | None = None

    def __init__(self, message: str, pg_error: psycopg.Error | None = None):
        super().__init__(message)
        self.pg_error = pg_error
        if pg_error is not None and pg_error.sqlstate:
            self.sqlstate = pg_error.sqlstate


class NullValueNotAllowed(PgqueError):
    """22004: a required argument (or array element) is NULL."""

    sqlstate = "22004"


class InvalidName(PgqueError):
    """42602: an empty name, a forbidden character, a ``#`` in a plain consumer."""

    sqlstate = "42602"


class NameTooLong(PgqueError):
    """42622: a name over its byte limit."""

    sqlstate = "42622"


class UndefinedObject(PgqueError):
    """42704: unknown queue, consumer, batch, job, dead letter..."""

    sqlstate = "42704"


class InvalidParameterValue(PgqueError):
    """22023: an unacceptable value (bad interval, unequal arrays, wrong N...)."""

    sqlstate = "22023"


class NumericValueOutOfRange(PgqueError):
    """22003: a number outside its range (priority, limit, max_attempts...)."""

    sqlstate = "22003"


class InvalidJson(PgqueError):
    """22P02: text that is not JSON given to a jsonb argument."""

    sqlstate = "22P02"


class WrongState(PgqueError):
    """55000: the object is in the wrong state (finished batch, a slot lease
    held by another worker, a queue that still has consumers...)."""

    sqlstate = "55000"


class DuplicateJob(PgqueError):
    """23505: a unique key held by a live job, with ``on_duplicate => 'error'``."""

    sqlstate = "23505"


class FeatureNotSupported(PgqueError):
    """0A000: e.g. a job-log call at REPEATABLE READ."""

    sqlstate = "0A000"


class ServerFeatureMissing(PgqueError):
    """Client side: the connected server's pgque has no such function
    (e.g. ``enqueue_flow`` or ``set_progress`` on a server before they existed)."""


class SlotLost(PgqueError):
    """Client side: a partitioned consumer's worker no longer holds its slot's
    lease (another worker took it over); it stops processing that slot."""


_BY_SQLSTATE: dict[str, type[PgqueError]] = {
    cls.sqlstate: cls
    for cls in (
        NullValueNotAllowed,
        InvalidName,
        NameTooLong,
        UndefinedObject,
        InvalidParameterValue,
        NumericValueOutOfRange,
        InvalidJson,
        WrongState,
        DuplicateJob,
        FeatureNotSupported,
    )
    if cls.sqlstate
}


def from_psycopg(err: psycopg.Error) -> PgqueError:
    """The typed exception for a psycopg error (PgqueError for other codes)."""
    cls = _BY_SQLSTATE.get(err.sqlstate or "", PgqueError)
    return cls(str(err).strip(), err)


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Re-raises a database error from the block as its typed PgqueError.

    Errors without a SQLSTATE (a lost connection) and those of the classes
    that are about the server rather than the call (08 connection, 53
    resources, 57 operator intervention such as a cancel or shutdown, 58 system)
    are left as psycopg raised them."""
    try:
        yield
    except psycopg.Error as e:
        code = e.sqlstate or ""
        if code in _BY_SQLSTATE or (code and code[:2] not in _PASS_THROUGH):
            raise from_psycopg(e) from e
        raise


_PASS_THROUGH = {"08", "53", "57", "58", "40", "25"}
