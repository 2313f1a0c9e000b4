"""System shared memory for `kiln serve`: the Open Inference Protocol's shared-memory extension (as
Triton defines it), so that a client on the same machine hands over inputs, and takes outputs,
through a POSIX shared-memory object instead of the request and the answer.

A client creates an object (shm_open: /dev/shm/<key>), registers a region of it under a name
(offset, byte size), then names the region in an input's parameters (shared_memory_region,
shared_memory_byte_size, shared_memory_offset): the server reads the input there, in place. An
output whose requested parameters name a region is written there and answered without its data.

The server maps objects of /dev/shm only: a key is one name (a leading '/' allowed, no other), the
object must be a regular file (no link followed) at least offset + byte_size long, and every read or
write stays inside its region. A region unregistered while requests still read it stays mapped
until they finish.

A server that runs models on a GPU pins each object it maps for the GPU (kiln.PinnedHostMemory), so
an engine's context copies inputs from the region straight to the device; an object the driver
will not pin is served unpinned (its inputs copied by the CPU first), with a warning.
"""
from __future__ import annotations

import logging
import mmap
import os
import re
import stat
import threading
from dataclasses import dataclass

import numpy as np

SHM_FOLDER = "/dev/shm"
log = logging.getLogger("kiln.serve")
_KEY = re.compile(r"^/?[A-Za-z0-9._-]+$")


class SharedMemoryError(ValueError):
    """A registration, or a request's use of a region, that the server refuses (the message says why)."""


class RegionNotFound(SharedMemoryError):
    pass


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    memory: object  # the whole object, mapped: an mmap, or a kiln.PinnedHostMemory over it

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


def _whole_number(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SharedMemoryError(f"{what} must be a whole number of at least 0, not {value!r}")
    return value


class Regions:
    """The regions registered with one server, by name (threads and the event loop share it)."""

    def __init__(self):
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()
        # The GPU to pin mapped objects with (kiln.PinnedHostMemory); None: not pinned (CPU models).
        self.pin_gpu: int | None = None

    def register(self, name: str, key: str, offset, byte_size) -> None:
        if not isinstance(name, str) or not name:
            raise SharedMemoryError("a shared-memory region needs a name")
        if not isinstance(key, str) or not _KEY.match(key) or key.strip("/") in (".", ".."):
            raise SharedMemoryError(f"region '{name}': key {key!r} is not the name of a shared-memory object "
                                    "(letters, digits, '.', '_' and '-', after an optional '/')")
        offset = _whole_number(offset, f"region '{name}': offset")
        byte_size = _whole_number(byte_size, f"region '{name}': byte_size")
        if byte_size == 0:
            raise SharedMemoryError(f"region '{name}': byte_size must be more than 0")
        with self._lock:
            if name in self._regions:
                raise SharedMemoryError(f"shared-memory region '{name}' is already registered")
        path = os.path.join(SHM_FOLDER, key.lstrip("/"))
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise SharedMemoryError(f"region '{name}': cannot open shared-memory object {key}: {e.strerror}") from e
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SharedMemoryError(f"region '{name}': {key} is not a shared-memory object")
            if offset + byte_size > info.st_size:
                raise SharedMemoryError(f"region '{name}': offset {offset} + byte_size {byte_size} is past the end of "
                                        f"{key} ({info.st_size} bytes)")
            memory = mmap.mmap(fd, info.st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        if self.pin_gpu is not None:
            memory = _pinned(memory, self.pin_gpu, name)
        with self._lock:
            if name in self._regions:
                raise SharedMemoryError(f"shared-memory region '{name}' is already registered")
            self._regions[name] = Region(name, key, offset, byte_size, memory)

    def unregister(self, name: str = "") -> None:
        """One region (no error if it is not registered, as Triton), or every one for name ""."""
        with self._lock:
            if name:
                self._regions.pop(name, None)
            else:
                self._regions.clear()
        # The mappings close when the last array over them goes (requests in flight keep theirs).

    def status(self, name: str = "") -> list[dict]:
        with self._lock:
            if not name:
                return [r.status() for r in self._regions.values()]
            if name not in self._regions:
                raise RegionNotFound(f"no shared-memory region '{name}' is registered")
            return [self._regions[name].status()]

    @staticmethod
    def _span_parameters(parameters: dict, what: str) -> tuple[str, int, int]:
        """The region's name, the offset in it and the byte size a tensor's parameters name."""
        name = parameters.get("shared_memory_region")
        if not isinstance(name, str):
            raise RegionNotFound(f"{what}: no shared-memory region {name!r} is registered")
        if "shared_memory_byte_size" not in parameters:
            raise SharedMemoryError(f"{what}: shared_memory_byte_size is missing")
        size = _whole_number(parameters["shared_memory_byte_size"], f"{what}: shared_memory_byte_size")
        offset = _whole_number(parameters.get("shared_memory_offset", 0), f"{what}: shared_memory_offset")
        return name, offset, size

    def _span_bytes(self, parameters: dict, what: str) -> np.ndarray:
        """The bytes a tensor's parameters name, as a uint8 array over the region (no copy)."""
        name, offset, size = self._span_parameters(parameters, what)
        with self._lock:
            region = self._regions.get(name)
        if region is None:
            raise RegionNotFound(f"{what}: no shared-memory region {name!r} is registered")
        if offset + size > region.byte_size:
            raise SharedMemoryError(f"{what}: offset {offset} + byte size {size} is past the end of region "
                                    f"'{region.name}' ({region.byte_size} bytes)")
        return np.frombuffer(region.memory, dtype=np.uint8, count=size, offset=region.offset + offset)

    def read(self, parameters: dict, dtype: np.dtype, shape: list[int], what: str) -> np.ndarray:
        """The input the parameters name, in place in the region (no copy)."""
        span = self._span_bytes(parameters, what)
        count = 1
        for d in shape:
            count *= int(d)
        if count * dtype.itemsize != span.nbytes:
            raise SharedMemoryError(f"{what}: shape {list(shape)} of {dtype} is {count * dtype.itemsize} bytes; "
                                    f"shared_memory_byte_size says {span.nbytes}")
        return span.view(dtype).reshape(shape)

    def write(self, parameters: dict, array: np.ndarray, what: str) -> None:
        """Writes an output where the parameters say."""
        span = self._span_bytes(parameters, what)
        if array.nbytes > span.nbytes:
            raise SharedMemoryError(f"{what}: the output is {array.nbytes} bytes; its region holds {span.nbytes}")
        span[:array.nbytes] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _pinned(memory: mmap.mmap, gpu: int, name: str):
    """The mapping pinned for the GPU, or itself when the driver refuses (said once per region)."""
    import kiln

    try:
        return kiln.PinnedHostMemory(memory, gpu=gpu)
    except kiln.Error as e:
        log.warning("shared-memory region '%s' is not pinned for the GPU (%s): its inputs are copied by the CPU first",
                    name, e)
        return memory


class NativeRegions(Regions):
    """The regions of kiln serve's native gRPC front (kiln._kiln.GrpcFront), for the HTTP front:
    one registry for both protocols, so a client registers a region over either and names it in
    requests over either. The front maps, pins and checks them (src/serve/shared_memory_regions.h,
    the same rules as Regions)."""

    def __init__(self, front):
        super().__init__()
        self._front = front

    def register(self, name: str, key: str, offset, byte_size) -> None:
        import kiln

        if not isinstance(name, str) or not isinstance(key, str):
            raise SharedMemoryError("a shared-memory region needs a name and a key (strings)")
        offset = _whole_number(offset, f"region '{name}': offset")
        byte_size = _whole_number(byte_size, f"region '{name}': byte_size")
        try:
            self._front.register_region(name, key, offset, byte_size)
        except kiln.Error as e:
            raise SharedMemoryError(str(e)) from e

    def unregister(self, name: str = "") -> None:
        self._front.unregister_region(name)

    def status(self, name: str = "") -> list[dict]:
        try:
            return self._front.region_status(name)
        except KeyError as e:
            raise RegionNotFound(e.args[0]) from e

    def _span_bytes(self, parameters: dict, what: str) -> np.ndarray:
        import kiln

        name, offset, size = self._span_parameters(parameters, what)
        try:
            return self._front.region_bytes(name, offset, size, what)
        except KeyError as e:
            raise RegionNotFound(e.args[0]) from e
        except kiln.Error as e:
            raise SharedMemoryError(str(e)) from e


# The regions clients registered with this server process (every model reads them); a server with
# the native gRPC front replaces it with that front's (NativeRegions). Code that Ray pickles reaches
# it through the module, which pickles by name.
REGIONS = Regions()


def uses_shared_memory(parameters) -> bool:
    return bool(parameters) and "shared_memory_region" in parameters
