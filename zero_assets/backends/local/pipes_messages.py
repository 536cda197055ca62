"""The local jobs' Pipes message reader: Dagster's temp-file reader, parsing whole lines only.

Dagster's `PipesTempFileMessageReader` parses partial lines of a long message still being written,
which stops its thread and loses every later message; here a partial line waits for its end.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from dagster import PipesMessageHandler, PipesMessageReader
from dagster_pipes import PipesDefaultMessageWriter, PipesParams

POLL_S = 0.01  # as Dagster's tail


def whole_lines(path: str, finished: Callable[[], bool]) -> Iterator[str]:
    """The lines appended to `path`, each once it is whole, until `finished()` and nothing is left to read.

    A last line the writer never ended (killed mid-write) comes out as it is."""
    with open(path, encoding="utf-8") as stream:
        pending = ""
        while True:
            ending = finished()  # before the read: what was written before the end is read below
            piece = stream.readline()
            if piece:
                pending += piece
                if pending.endswith("\n"):
                    yield pending
                    pending = ""
            elif ending:
                if pending:
                    yield pending
                return
            else:
                time.sleep(POLL_S)


class WholeLineMessageReader(PipesMessageReader):
    """Reads a local job's Pipes messages from a temp file, parsing each line only once it is whole.

    Built on the public `PipesMessageReader`: `PipesFileMessageReader`'s reading thread is private."""

    @contextmanager
    def read_messages(self, handler: PipesMessageHandler) -> Iterator[PipesParams]:
        with tempfile.TemporaryDirectory(prefix="zero-pipes-") as folder:
            path = os.path.join(folder, "messages.jsonl")
            open(path, "w").close()
            ended = threading.Event()
            reader = threading.Thread(
                target=self._read, args=(path, handler, ended), daemon=True, name="zero-pipes-reader"
            )
            reader.start()
            try:
                yield {
                    PipesDefaultMessageWriter.FILE_PATH_KEY: path,
                    PipesDefaultMessageWriter.INCLUDE_STDIO_IN_MESSAGES_KEY: False,
                }
            finally:
                ended.set()
                reader.join()

    @staticmethod
    def _read(path: str, handler: PipesMessageHandler, ended: threading.Event) -> None:
        try:
            for line in whole_lines(path, ended.is_set):
                handler.handle_message(json.loads(line))
        except Exception:
            handler.report_pipes_framework_exception("the local jobs' Pipes message reader", sys.exc_info())
            raise

    def no_messages_debug_text(self) -> str:
        return "Attempted to read messages from a local temporary file."
