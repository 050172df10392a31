"""``python moto_atomic.py ARGS``: moto's S3 server (``moto.server`` ARGS) whose object writes are atomic, as S3's are.

moto's threaded server checks a PutObject's ``If-Match`` / ``If-None-Match`` and then stores the
object as two steps, so two conditional writes that arrive together can both pass the check (on a
loaded machine, two drivers both took an expired lease). S3 decides each conditional write
against the object as it stands, one at a time. Here each PutObject and DeleteObject runs under
one lock, after its body has been read, so a stalled upload holds nothing.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any


def _serialized(method: Callable[..., Any], lock: threading.Lock) -> Callable[..., Any]:
    @functools.wraps(method)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return method(*args, **kwargs)

    return locked


def main(argv: list[str]) -> None:
    from moto import server
    from moto.s3.responses import S3Response

    lock = threading.Lock()
    for name in ("put_object", "delete_object"):
        setattr(S3Response, name, _serialized(getattr(S3Response, name), lock))
    server.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
