"""Fake members' admin ports for cluster-tool tests: threaded TCP servers on 127.0.0.1
that decode each ``AdminCommand`` and send back what their ``answer`` returns."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from cluster.protocol.admin import AdminCommand, AdminReply
from cluster.protocol.codec import ADMIN
from cluster.protocol.framing import FrameDecoder, encode_frame

Answer = Callable[[AdminCommand], AdminReply]


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, answer: Answer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer = answer


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        decoder = FrameDecoder()
        while data := self.request.recv(65536):
            for frame in decoder.feed(data):
                command = ADMIN.decode(frame)
                assert isinstance(command, AdminCommand)
                self.request.sendall(encode_frame(self.server.answer(command)))


@contextmanager
def admin_ports(*answers: Answer) -> Iterator[list[int]]:
    """One listening admin port per ``answer``, served until the block ends."""
    servers = [_Server(answer) for answer in answers]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    try:
        yield [int(s.server_address[1]) for s in servers]
    finally:
        for server, thread in zip(servers, threads, strict=True):
            server.shutdown()
            thread.join()
            server.server_close()


def reply_with(body: bytes) -> Answer:
    """An answer that says ok to every command, with ``body``."""
    return lambda command: AdminReply(command.correlation_id, True, "", body)
