"""Running a use case again when its transaction lost an optimistic-concurrency race."""

from __future__ import annotations

import functools
import time

from sqlalchemy.orm.exc import StaleDataError

CONFLICT_RETRIES = 5
CONFLICT_MESSAGE = "the object was changed concurrently; retry the request"


def retry_on_conflict(route):
    """Run a write route again when its transaction lost an optimistic-concurrency race.

    The scheduler updates pending jobs' reasons and starts jobs concurrently with users'
    requests; a request that loses such a race was rolled back whole, so running it again
    is safe, and the user never sees the conflict unless it persists.
    """
    @functools.wraps(route)
    def wrapper(*args, **kwargs):
        for attempt in range(CONFLICT_RETRIES):
            try:
                return route(*args, **kwargs)
            except StaleDataError:
                if attempt == CONFLICT_RETRIES - 1:
                    raise
                time.sleep(0.005 * (attempt + 1))

    return wrapper
