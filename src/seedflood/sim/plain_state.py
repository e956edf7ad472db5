"""An algorithm's attributes as plain data and tensors, so a checkpoint loads with
``weights_only=True`` and names no code to run.

Each value becomes a tree of dicts with string keys, lists, str, int, float, bool and None; its
tensors (and numpy arrays, as tensors) go into one list beside the tree, so tensors that share
memory keep sharing it. Every node that is not a bare scalar is a dict whose "t" says what it
was. Objects that are shared or refer to themselves are written once and referred to by number
afterwards, as pickle does. Objects of classes are written as their class's name and their
attributes, and rebuilt without calling any constructor; only seedflood's own classes are
rebuilt, so a file cannot name a class that runs code.

Values a fresh build recreates (the model, its parameters, the direction: see
`seedflood.sim.checkpoint`) are written as references and resolved against the fresh build.
"""

from __future__ import annotations

import collections
import importlib
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

Token = tuple[str, str]
SCALARS = (type(None), bool, int, float, str)
ROOT_PACKAGE = "seedflood"
_DICTS: dict[type, str] = {
    dict: "dict",
    collections.Counter: "counter",
    collections.OrderedDict: "ordered",
}
_SEQUENCES: dict[type, str] = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset"}
_MAPPINGS: dict[str, Callable[[], Any]] = {v: k for k, v in _DICTS.items()}
_BAGS: dict[str, Callable[[], Any]] = {"list": list, "set": set}
_FROZEN: dict[str, Callable[[Any], Any]] = {"tuple": tuple, "frozenset": frozenset}
BIT_GENERATORS = ("MT19937", "PCG64", "PCG64DXSM", "Philox", "SFC64")


class PlainStateError(ValueError):
    """A node that this code does not rebuild: the file was written by other code, or crafted."""


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _own_class(name: str) -> type:
    """The seedflood class called ``name`` ("module:qualname"), refusing any other."""
    module_name, _, qualname = name.partition(":")
    if module_name.split(".")[0] != ROOT_PACKAGE or "<" in qualname:
        raise PlainStateError(f"refusing to rebuild {name!r}: not a seedflood class")
    found: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not isinstance(found, type) or found.__module__ != module_name:
        raise PlainStateError(f"{name!r} is not a seedflood class")
    return found


def _attributes(value: Any) -> dict[str, Any]:
    """What pickle would keep of an object: what its class's ``__getstate__`` returns where that
    is a dict of attributes (a slotted dataclass returns a list of values instead), else its
    ``__dict__`` and slots."""
    if type(value).__getstate__ is not object.__getstate__:
        state = value.__getstate__()
        if isinstance(state, dict):
            return state
    state = dict(getattr(value, "__dict__", {}))
    for cls in type(value).__mro__:
        slots = getattr(cls, "__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and hasattr(value, slot):
                state[slot] = getattr(value, slot)
    return state


class Encoder:
    """Turns values into plain trees; ``tensors`` collects the tensors they hold."""

    def __init__(self, references: dict[int, tuple[Token, Any]]) -> None:
        self.references = references
        self.tensors: list[torch.Tensor] = []
        self._tensor_index: dict[int, int] = {}
        self._memo: dict[int, int] = {}
        self._kept: list[Any] = []  # encoded objects stay alive, so their ids stay unique

    def _tensor(self, tensor: torch.Tensor) -> int:
        index = self._tensor_index.setdefault(id(tensor), len(self.tensors))
        if index == len(self.tensors):
            self.tensors.append(tensor)
        return index

    def encode(self, value: Any, where: str) -> Any:
        if type(value) in SCALARS:
            return value
        if id(value) in self.references:
            kind, name = self.references[id(value)][0]
            return {"t": "ref", "kind": kind, "name": name}
        if isinstance(value, torch.Tensor):
            return {"t": "tensor", "i": self._tensor(value)}
        if id(value) in self._memo:
            return {"t": "memo", "n": self._memo[id(value)]}
        number = self._memo[id(value)] = len(self._memo)
        self._kept.append(value)
        return {"n": number, **self._node(value, where)}

    def _node(self, value: Any, where: str) -> dict[str, Any]:
        kind = type(value)
        if kind in _DICTS:
            items = [
                [self.encode(k, f"{where} key"), self.encode(v, f"{where}[{k!r}]")]
                for k, v in value.items()
            ]
            return {"t": _DICTS[kind], "items": items}
        if kind in _SEQUENCES or kind is collections.deque:
            items = [self.encode(item, f"{where}[{i}]") for i, item in enumerate(value)]
            if kind is collections.deque:
                return {"t": "deque", "items": items, "maxlen": value.maxlen}
            return {"t": _SEQUENCES[kind], "items": items}
        if kind is bytes:
            return {"t": "bytes", "hex": value.hex()}
        if kind is np.ndarray:
            tensor = torch.from_numpy(np.require(value, requirements=["C", "W"]))
            return {"t": "ndarray", "i": self._tensor(tensor), "dtype": str(value.dtype)}
        if isinstance(value, np.generic):
            return {"t": "numpy", "dtype": str(value.dtype), "value": value.item()}
        if kind is random.Random:
            return {"t": "random", "state": self.encode(value.getstate(), f"{where} state")}
        if kind is np.random.Generator:
            state = self.encode(value.bit_generator.state, f"{where} state")
            return {"t": "numpy_generator", "state": state}
        if kind is torch.Generator:
            state = self._tensor(value.get_state())
            return {"t": "torch_generator", "device": str(value.device), "i": state}
        if kind.__module__.split(".")[0] == ROOT_PACKAGE and "<" not in kind.__qualname__:
            attributes = {
                name: self.encode(item, f"{where}.{name}")
                for name, item in _attributes(value).items()
            }
            return {"t": "object", "class": _class_name(kind), "attributes": attributes}
        raise TypeError(
            f"{where} is a {_class_name(kind)}, which a checkpoint cannot hold: keep algorithm "
            "state as plain data, tensors, numpy arrays, generators or seedflood objects"
        )


class Decoder:
    """Rebuilds what an Encoder wrote, given the fresh build's references and the tensors."""

    def __init__(self, references: dict[Token, Any], tensors: list[torch.Tensor]) -> None:
        self.references = references
        self.tensors = tensors
        self._memo: dict[int, Any] = {}

    def decode(self, node: Any) -> Any:
        if type(node) in SCALARS:
            return node
        kind = node["t"]
        if kind == "ref":
            token = (node["kind"], node["name"])
            if token not in self.references:
                raise PlainStateError(
                    f"the checkpoint refers to {token[0]} {token[1]!r}, which this build does "
                    "not have: it was written by other code"
                )
            return self.references[token]
        if kind == "tensor":
            return self.tensors[node["i"]]
        if kind == "memo":
            return self._memo[node["n"]]
        return self._built(node)

    def _remember(self, node: dict[str, Any], value: Any) -> Any:
        self._memo[node["n"]] = value
        return value

    def _built(self, node: dict[str, Any]) -> Any:
        kind = node["t"]
        if kind in _MAPPINGS:
            mapping = self._remember(node, _MAPPINGS[kind]())
            for key, item in node["items"]:
                mapping[self.decode(key)] = self.decode(item)
            return mapping
        if kind in ("list", "set", "deque"):
            built = collections.deque(maxlen=node["maxlen"]) if kind == "deque" else _BAGS[kind]()
            self._remember(node, built)
            add = built.add if kind == "set" else built.append
            for item in node["items"]:
                add(self.decode(item))
            return built
        if kind in _FROZEN:
            return self._remember(node, _FROZEN[kind](map(self.decode, node["items"])))
        return self._remember(node, self._leaf(node))

    def _leaf(self, node: dict[str, Any]) -> Any:
        kind = node["t"]
        if kind == "bytes":
            return bytes.fromhex(node["hex"])
        if kind == "ndarray":
            return self.tensors[node["i"]].numpy().astype(node["dtype"], copy=True)
        if kind == "numpy":
            return np.dtype(node["dtype"]).type(node["value"])
        if kind == "random":
            generator = random.Random()
            generator.setstate(self.decode(node["state"]))
            return generator
        if kind == "numpy_generator":
            state = self.decode(node["state"])
            if state["bit_generator"] not in BIT_GENERATORS:
                raise PlainStateError(f"unknown bit generator {state['bit_generator']!r}")
            bit_generator = getattr(np.random, state["bit_generator"])()
            bit_generator.state = state
            return np.random.Generator(bit_generator)
        if kind == "torch_generator":
            generator = torch.Generator(node["device"])
            generator.set_state(self.tensors[node["i"]])
            return generator
        if kind == "object":
            return self._object(node)
        raise PlainStateError(f"unknown node kind {kind!r}")

    def _object(self, node: dict[str, Any]) -> Any:
        cls = _own_class(node["class"])
        built = self._remember(node, cls.__new__(cls))
        for name, item in node["attributes"].items():
            object.__setattr__(built, name, self.decode(item))
        return built
