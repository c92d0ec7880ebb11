"""A CUDA stand-in for device-discipline tests on a machine without a GPU.

On CPU every tensor lives on one device, so code that builds a tensor without `device=` and then meets a CUDA
tensor ("Expected all tensors to be on the same device") passes every CPU test and crashes on the first GPU run.
`FakeCuda` makes that crash happen here: tensors "on cuda" keep their CPU storage but carry a cuda label, and
every torch call checks that its tensor arguments carry one label, as a CUDA kernel checks devices.

- `fake.put(x)` labels a tensor, or every parameter and buffer of a module, as cuda:0;
- `.device` of a labelled tensor reports cuda:0, so `torch.ones(k, device=x.device)` follows the label;
- factories given a cuda device, `.to(cuda)`, `.to(other)` and `.cuda()` give labelled results, `.cpu()` and
  `.to("cpu")` unlabelled ones; other calls label their results when their inputs were labelled;
- 0-dim tensors mix with either, as torch allows (a CPU scalar may meet a CUDA tensor).
This is a fake at the CUDA boundary only: the arithmetic is torch's own, on CPU.
"""

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")
_MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu}


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int)  # a CUDA ordinal


def _real(device):
    return CPU if _is_cuda(device) else device


class FakeCuda(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.label = WeakIdKeyDictionary()  # tensor -> "cuda"; unlabelled tensors are on the CPU

    def put(self, obj):
        """Label a tensor, or a module's parameters and buffers, as living on cuda:0; returns it."""
        tensors = list(obj.parameters()) + list(obj.buffers()) if isinstance(obj, torch.nn.Module) else [obj]
        for tensor in tensors:
            self.label[tensor] = "cuda"
        return obj

    def on_cuda(self, tensor: torch.Tensor) -> bool:
        return self.label.get(tensor) == "cuda"

    def _where(self, tensor) -> str:
        return self.label.get(tensor, "cpu")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        getter_of = getattr(func, "__self__", None)  # property getters arrive as `<descriptor>.__get__`
        if getter_of is torch.Tensor.device:
            return CUDA if self.on_cuda(args[0]) else func(*args)
        if getter_of is torch.Tensor.is_cuda:
            return self.on_cuda(args[0])

        target = None  # "cuda" / "cpu" when the call says where its result goes
        if "device" in kwargs and kwargs["device"] is not None:
            target = "cuda" if _is_cuda(kwargs["device"]) else "cpu"
            kwargs["device"] = _real(kwargs["device"])
        if func in _MOVES:
            if func is torch.Tensor.cuda:
                target, args = "cuda", args[:1]
            elif func is torch.Tensor.cpu:
                target = "cpu"
            else:
                rest = []
                for arg in args[1:]:
                    if isinstance(arg, torch.Tensor):  # .to(other): other's device (and dtype)
                        target = self._where(arg)
                        arg = arg.dtype
                    elif isinstance(arg, (torch.device, str, int)) and not isinstance(arg, bool):
                        target = "cuda" if _is_cuda(arg) else "cpu"
                        arg = _real(arg)
                    rest.append(arg)
                args = (args[0], *rest)
            source = self._where(args[0])
            result = func(*args, **kwargs)
            if result is args[0] and (target or source) != source:
                result = result.view_as(result)  # the real storage did not move: a new tensor object, as a copy
            self._mark(result, target or source)
            return result

        flat, _ = tree_flatten((args, kwargs))
        places = {self._where(t) for t in flat if isinstance(t, torch.Tensor) and t.dim() > 0}
        if len(places) > 1:
            name = getattr(func, "__qualname__", getattr(func, "__name__", str(func)))
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"cuda:0 and cpu! (FakeCuda, in {name})")
        result = func(*args, **kwargs)
        where = target or (places.pop() if places else None)
        if where is None:  # only scalars in: follow any labelled scalar
            where = "cuda" if any(isinstance(t, torch.Tensor) and self.on_cuda(t) for t in flat) else "cpu"
        self._mark(result, where)
        return result

    def _mark(self, result, where: str) -> None:
        if where != "cuda":
            return

        def mark(value):
            if isinstance(value, torch.Tensor):
                self.label[value] = "cuda"
            return value

        tree_map(mark, result)
