"""A free TCP port on 127.0.0.1 (standard library only).

For a local rendezvous (``mnnvl.runtime.local``) and the simulator's Service ports
(``mnnvl.sim``), which must not import the worker side.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a local rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
