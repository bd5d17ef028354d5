"""Faults the tests inject: a disk that fills up in the middle of a write."""
import errno


def full_disk_open(written: int = 4):
    """A stand-in for ``open`` whose files take WRITTEN bytes of the first write, then raise ENOSPC, as a full disk
    does (monkeypatched into the module that writes)."""
    class FullDiskFile:
        def __init__(self, path, mode):
            self.f = open(path, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(bytes(data[:written]))
            raise OSError(errno.ENOSPC, "No space left on device", self.f.name)

    return FullDiskFile
