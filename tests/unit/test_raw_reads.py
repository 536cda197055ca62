"""Reading one located raw file (training_code/lib/raw_files.py): the whole file in one read, never a
final symlink's target, never a wait on a FIFO, and a file that grew past the limit while being read
refused, not kept."""

import errno
import os

import pytest

from training_code.lib.raw_files import Refused, _read_regular_fd, read_limited, read_regular


def test_a_regular_file_is_read_whole(tmp_path):
    path = tmp_path / "img.jpg"
    data = os.urandom(3 << 20)
    path.write_bytes(data)
    assert read_regular(str(path)) == data
    assert read_limited(path, len(data)) == data


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "img.jpg"
    os.mkfifo(fifo)
    with pytest.raises(Refused, match="not a regular file"):
        read_regular(str(fifo))


def test_a_final_symlink_is_not_followed(tmp_path):
    (tmp_path / "target.jpg").write_bytes(b"secret")
    (tmp_path / "img.jpg").symlink_to(tmp_path / "target.jpg")
    with pytest.raises(OSError) as raised:
        read_regular(str(tmp_path / "img.jpg"))
    assert raised.value.errno == errno.ELOOP


@pytest.mark.parametrize("max_bytes", [None, 100, 99])
def test_a_file_that_grew_after_its_fstat_is_read_to_its_end_or_refused_past_the_limit(tmp_path, max_bytes):
    path = tmp_path / "img.jpg"
    data = os.urandom(100)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:  # the fstat said 10 bytes; the file holds 100 by the time it is read
        if max_bytes is not None and max_bytes < len(data):
            with pytest.raises(Refused, match="grew while being read"):
                _read_regular_fd(fd, 10, max_bytes)
        else:
            assert _read_regular_fd(fd, 10, max_bytes) == data
    finally:
        os.close(fd)


def test_short_reads_are_read_on_to_the_end(tmp_path, monkeypatch):
    # A read may return fewer bytes than asked without being at the end (Linux caps one at 2 GiB).
    path = tmp_path / "img.jpg"
    data = os.urandom(1000)
    path.write_bytes(data)
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: real_read(fd, min(n, 300)))
    assert read_regular(str(path)) == data
    assert read_limited(path, len(data)) == data
