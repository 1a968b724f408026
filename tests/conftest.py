"""Fixtures shared by the test files."""

import errno
import io
import os

import pytest


@pytest.fixture
def full_disk(monkeypatch):
    """full_disk(folder): from then on, files that open() creates under folder are made but fail on their
    first write, as on a full disk (OSError ENOSPC); pathlib's own writes (io.open) are left alone."""
    real_open = open

    class Full(io.RawIOBase):
        def writable(self):
            return True

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fill(folder):
        def fake_open(file, mode="r", *args, **kwargs):
            if any(m in mode for m in "wax") and os.path.abspath(file).startswith(os.path.abspath(folder)):
                real_open(file, mode).close()  # creating the file works, as on a real full disk
                return Full()
            return real_open(file, mode, *args, **kwargs)

        monkeypatch.setattr("builtins.open", fake_open)

    return fill
