"""A real HTTP file server on 127.0.0.1 for the download tests: serves a directory, honours
Range requests (resumable downloads), and can cut a response off midway, as a flaky network does."""
from __future__ import annotations

import http.server
import threading
from pathlib import Path


class Server:
    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.requests: list[dict] = []
        self.cut_after: dict[str, int] = {}  # path -> bytes to send before dropping, once
        handler = self._handler()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "Server":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _file(self) -> Path | None:
                path = (server.directory / self.path.lstrip("/")).resolve()
                return path if path.is_file() and server.directory.resolve() in path.parents else None

            def do_HEAD(self):
                self._respond(body=False)

            def do_GET(self):
                self._respond(body=True)

            def _respond(self, body: bool):
                server.requests.append({"method": self.command, "path": self.path,
                                        "range": self.headers.get("Range")})
                path = self._file()
                if path is None:
                    self.send_error(404)
                    return
                size = path.stat().st_size
                start = 0
                if self.headers.get("Range", "").startswith("bytes="):
                    start = int(self.headers["Range"][6:].split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(size - start))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                if not body:
                    return
                limit = server.cut_after.pop(self.path, None) if self.command == "GET" else None
                with path.open("rb") as handle:
                    handle.seek(start)
                    remaining = size - start if limit is None else min(limit, size - start)
                    while remaining > 0:
                        block = handle.read(min(1 << 16, remaining))
                        self.wfile.write(block)
                        remaining -= len(block)
                if limit is not None:
                    self.wfile.flush()
                    self.connection.shutdown(2)  # drop the connection midway
                    self.close_connection = True

        return Handler
