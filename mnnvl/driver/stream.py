"""Reading streamed responses: watch events and followed logs, line by line.

:class:`mnnvl.driver.api.Api` opens the stream (through its one retry helper); the functions
here consume it and always release the connection, also when the caller stops early.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from mnnvl.driver.retry import from_api_exception
from mnnvl.errors import WatchExpired

logger = logging.getLogger(__name__)


def watch_events(resp: Any, what: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Events ``(type, object)`` of an open watch response.

    ``BOOKMARK`` events are passed on: their object carries only ``metadata.resourceVersion``,
    the point a resumed watch starts from (so a quiet watch never falls out of the server's
    history and needs no re-list). Raises ``WatchExpired`` on 410 Gone and the mapped API
    error on any other ERROR event.
    """
    try:
        for line in iter_resp_lines(resp):
            event = json.loads(line)
            etype, obj = event.get("type", ""), event.get("object") or {}
            if etype == "ERROR":
                raise _watch_error(obj, what)
            yield etype, obj
    except (urllib3.exceptions.HTTPError, ConnectionError) as e:
        # A read timeout or a dropped stream ends this watch; the caller re-watches or
        # stops at its deadline.
        logger.debug("watch %s ended: %s", what, e)
    finally:
        resp.release_conn()


def _watch_error(status: dict[str, Any], what: str) -> Exception:
    """The error for a watch ERROR event (its object is a ``Status``)."""
    code = int(status.get("code") or 0)
    message = f"watch {what}: {status.get('reason')}: {status.get('message')}"
    if code == 410:
        return WatchExpired(message)
    return from_api_exception(
        ApiException(status=code, reason=str(status.get("reason"))), "watch", what
    )


def log_lines(resp: Any) -> Iterator[str]:
    """Lines of an open ``follow=true`` log response as they arrive.

    A stream cut by the API server (a restart) just ends: the caller reads the stored log
    when it needs the whole of it.
    """
    try:
        yield from iter_resp_lines(resp)
    except (urllib3.exceptions.HTTPError, ConnectionError) as e:
        logger.info("log stream cut (%s); the whole log is read again when the Job ends", e)
    finally:
        resp.release_conn()
