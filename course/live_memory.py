"""The bytes of tensor memory a rank holds, measured now and at the peak, on CPU or CUDA.

    with LiveMemory(device) as memory:
        memory.track(model, optimizer)         # on CPU: storages made before the context
        loss = model(x).sum(); memory.mark("after forward")
        loss.backward();        memory.mark("after backward")
    memory.peak, memory.marks["after forward"], memory.now()     # bytes

On CUDA it asks the caching allocator: `torch.cuda.memory_allocated`, and
`max_memory_allocated` since the context began (it resets the device's peak on
entering, so two trackers on one device at once disturb each other). That counts
every tensor on the device, tracked or not.

On CPU no allocator keeps such a count, so a TorchDispatchMode watches every op of
this thread (autograd's backward on CPU runs in the calling thread, so gradients
are seen) and records the untyped storage of each output. A storage counts once,
however many views share it; an output that aliases an input's storage is a view,
not new memory, and counts only if that storage already did. A storage stops
counting when it is freed: torch keeps one Python object per storage for as long
as its memory lives (PyObject preservation, torch 2.2 and newer), so a weak
reference to it dies with the memory, not with a wrapper. Sizes are read afresh
(`nbytes()`) after every op and at mark and now, so `storage.resize_(0)` and
`resize_(n)`, which free and regrow memory without an op, count from then on.

What is measured: tensors' storages, after each op (so with the op's inputs still
alive). Not measured: an op's scratch memory freed before it returns, Python
objects, storages made before the context unless tracked, tensors of other
threads, CUDA's cached but unallocated blocks (`memory_reserved`), and the buffers
gloo and NCCL keep inside torch.distributed, which are not tensors any op returns.

Used in: lab 5 (05_sharded_data_parallel), lab 6 (06_pipeline_parallel), lab 7 (07_long_sequences).
"""
from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _plain_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The tensors holding memory: the tensor itself, or a subclass's (DTensor's) inner tensors."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) and hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        inner = (getattr(tensor, name) for name in names)   # DTensor's include its DeviceMesh
        return [t for value in inner if isinstance(value, torch.Tensor) for t in _plain_tensors(value)]
    return [tensor]


def _storages(values, device: torch.device) -> list[torch.UntypedStorage]:
    """The untyped storages on `device` of the tensors among `values` (any nesting of lists, dicts)."""
    found = []
    for value in tree_flatten(values)[0]:
        if not isinstance(value, torch.Tensor):
            continue
        for tensor in _plain_tensors(value):
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, NotImplementedError):  # sparse tensors, wrappers without data
                continue
            if storage.device == device:
                found.append(storage)
    return found


class _StorageCounter(TorchDispatchMode):
    """Records the storage of every op's output, on one device; keeps the live total's peak."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device, self.storages, self.peak = device, weakref.WeakSet(), 0

    def live_bytes(self) -> int:
        live = sum(storage.nbytes() for storage in list(self.storages))
        self.peak = max(self.peak, live)
        return live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # torch.tensor(data) builds its tensor below the dispatcher, then lift_fresh returns it: new memory
        fresh = func is torch.ops.aten.lift_fresh.default
        inputs = set() if fresh else {id(s) for s in _storages((args, kwargs), self.device)}
        for storage in _storages(out, self.device):
            if id(storage) not in inputs:  # a view or an in-place result shares an input's storage
                self.storages.add(storage)
        self.live_bytes()
        return out


class LiveMemory:
    """Bytes of tensor memory alive on `device` ("cpu", "cuda", "cuda:N" or a torch.device):
    `now()`, `peak` since the context began (or `reset_peak()`), and `marks[name]`."""

    def __init__(self, device):
        self.device = _parse_device(device)
        self.marks: dict[str, int] = {}
        self._counter = _StorageCounter(self.device) if self.device.type == "cpu" else None
        self._inside, self._final_peak = False, None

    def __enter__(self) -> LiveMemory:
        if self._inside:
            raise RuntimeError("this LiveMemory is already measuring; make a new one for a nested measurement")
        self._inside, self._final_peak = True, None
        self.reset_peak()
        if self._counter is not None:
            self._counter.__enter__()
        return self

    def __exit__(self, *exc_info):
        if self._counter is not None:
            self._counter.__exit__(*exc_info)
        self._final_peak = self.peak
        self._inside = False
        return False

    def track(self, *objects) -> LiveMemory:
        """Count the storages of tensors made before the context: tensors, modules (parameters,
        buffers, .grad), optimizers (their state), and lists or dicts of these. On CUDA every
        tensor on the device counts already; track only checks what it is given."""
        tensors = _tensors_of(objects)
        if self._counter is None:  # CUDA; an optimizer's state may hold CPU tensors (Adam's step) there
            return self
        for tensor in tensors:
            if tensor.device != self.device:
                raise ValueError(f"track was given a tensor of shape {tuple(tensor.shape)} on {tensor.device}, but "
                                 f"this LiveMemory measures {self.device}: measure on {tensor.device}, or move "
                                 f"the model there")
            for storage in _storages(tensor, self.device):
                self._counter.storages.add(storage)
        self._counter.live_bytes()
        return self

    def now(self) -> int:
        """Bytes alive on the device now (on CPU: those made inside the context or tracked)."""
        if self._counter is None:
            return torch.cuda.memory_allocated(self.device)
        return self._counter.live_bytes()

    @property
    def peak(self) -> int:
        """The most bytes alive at once since the context began or reset_peak(), frozen on exit."""
        if self._final_peak is not None:
            return self._final_peak
        if self._counter is None:
            return torch.cuda.max_memory_allocated(self.device)
        self._counter.live_bytes()
        return self._counter.peak

    def reset_peak(self) -> None:
        """Start the peak afresh from the bytes alive now."""
        if self._counter is None:
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._counter.peak = 0
            self._counter.live_bytes()

    def mark(self, name: str) -> int:
        """Record the bytes alive now under `name`, and return them."""
        self.marks[name] = self.now()
        return self.marks[name]


def _parse_device(device) -> torch.device:
    if not isinstance(device, (str, torch.device)):
        raise ValueError(f"LiveMemory needs a device, such as 'cpu', 'cuda:0' or torch.device('cuda', 0); "
                         f"got {type(device).__name__} {device!r}")
    try:
        device = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"LiveMemory cannot read {device!r} as a device ({error}); pass 'cpu' or 'cuda:N'") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"LiveMemory was asked to measure {device}, but this process sees no CUDA device; "
                             f"measure 'cpu' (course.device() gives this rank's device)")
        return torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
    if device.type != "cpu":
        raise ValueError(f"LiveMemory measures 'cpu' or 'cuda:N' memory, not {device.type!r}")
    return device


def _tensors_of(objects, in_state: bool = False) -> list[torch.Tensor]:
    """Every tensor that `objects` hold (see LiveMemory.track), or a ValueError naming what is not one.
    Inside a state dict, numbers and None are values, not mistakes (an optimizer's step may be a float)."""
    tensors = []
    for item in objects:
        if isinstance(item, torch.Tensor):
            tensors.append(item)
        elif isinstance(item, torch.nn.Module):
            tensors += [*item.parameters(), *item.buffers()]
            tensors += [p.grad for p in item.parameters() if p.grad is not None]
        elif isinstance(item, torch.optim.Optimizer):
            tensors += _tensors_of(item.state.values(), in_state=True)
        elif isinstance(item, Mapping):
            tensors += _tensors_of(item.values(), in_state=True)
        elif isinstance(item, Iterable) and not isinstance(item, (str, bytes)):
            tensors += _tensors_of(item, in_state)
        elif not (in_state and (item is None or isinstance(item, (int, float, bool, str)))):
            raise ValueError(f"track takes tensors, modules, optimizers, or lists and dicts of them; got "
                             f"{type(item).__name__} {item!r:.60}. Pass the model and the optimizer themselves")
    return tensors
