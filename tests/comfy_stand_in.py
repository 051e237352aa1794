"""A stand-in of ComfyUI's ``comfy_api.latest`` (``io`` and ``ComfyExtension``) for running the nodes without
ComfyUI: conftest installs it as ``comfy_api.latest`` before the pack's nodes import, when the real module is absent.

It holds only what the pack's nodes use, and builds the same ``/object_info`` entry as ComfyUI 0.3.64 does for
them (``GET_NODE_INFO_V1``); tests/test_comfyui.py compares the two on a real server.
"""

import importlib.util
import sys
import types
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum


def _prune(d):
    return {k: v for k, v in d.items() if v is not None}


class _Input:
    io_type = None
    _fixed = {}  # keys the real class always writes (False is kept, only None is pruned)
    _rename = {"display_mode": "display", "dynamic_prompts": "dynamicPrompts", "force_input": "forceInput"}

    def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, **options):
        self.id, self.display_name, self.optional, self.tooltip, self.lazy = id, display_name, optional, tooltip, lazy
        self.options = options
        self.default = options.get("default")

    def as_dict(self):
        out = _prune({"display_name": self.display_name, "optional": self.optional, "tooltip": self.tooltip,
                      "lazy": self.lazy})
        out.update({k: self.options.get(k, v) for k, v in self._fixed.items()})
        out.update(_prune({self._rename.get(k, k): v for k, v in self.options.items() if k not in self._fixed}))
        return out

    def get_io_type(self):
        return self.io_type


class _Output:
    io_type = None

    def __init__(self, id=None, display_name=None, tooltip=None, is_output_list=False):
        self.id, self.display_name, self.tooltip, self.is_output_list = id, display_name, tooltip, is_output_list


def _type(io_type, fixed=None):
    inp = type("Input", (_Input,), {"io_type": io_type, "_fixed": dict(fixed or {})})
    out = type("Output", (_Output,), {"io_type": io_type})
    return type(io_type, (), {"io_type": io_type, "Input": inp, "Output": out})


class _ComboInput(_Input):
    io_type = "COMBO"

    def __init__(self, id, options=None, display_name=None, optional=False, tooltip=None, lazy=None, **kw):
        super().__init__(id, display_name, optional, tooltip, lazy, **kw)
        self.choices = list(options)

    def as_dict(self):
        return {**super().as_dict(), "multiselect": False, "options": self.choices}


class Hidden(str, Enum):
    unique_id = "UNIQUE_ID"
    prompt = "PROMPT"
    extra_pnginfo = "EXTRA_PNGINFO"
    dynprompt = "DYNPROMPT"


class HiddenHolder:
    def __init__(self, values=None):
        values = values or {}
        for h in Hidden:
            setattr(self, h.name, values.get(h.value, values.get(h)))


@dataclass
class Schema:
    node_id: str
    display_name: str = None
    category: str = "sd"
    inputs: list = None
    outputs: list = None
    hidden: list = None
    description: str = ""
    is_output_node: bool = False
    extra: dict = field(default_factory=dict)

    def validate(self):
        """As ComfyUI's: ids unique among the inputs, among the outputs, and between the two."""
        ins = [i.id for i in self.inputs or []]
        outs = [o.id for o in self.outputs or [] if o.id is not None]
        if len(set(ins)) != len(ins) or len(set(outs)) != len(outs) or set(ins) & set(outs):
            raise ValueError(f"{self.node_id}: input and output ids must be unique ({ins}, {outs})")

    def finalize(self):
        if self.is_output_node:
            self.hidden = list(self.hidden or [])
            for h in (Hidden.prompt, Hidden.extra_pnginfo):
                if h not in self.hidden:
                    self.hidden.append(h)
        for i, o in enumerate(self.outputs or []):
            if o.id is None:
                o.id = f"_{i}_{o.io_type}_"
        return self

    def get_v1_info(self, cls):
        inputs = {"required": {}}
        for i in self.inputs or []:
            d = i.as_dict()
            d.pop("optional", None)
            inputs.setdefault("optional" if i.optional else "required", {})[i.id] = (i.get_io_type(), d)
        for h in self.hidden or []:
            inputs.setdefault("hidden", {})[h.name] = (h.value,)
        outs = self.outputs or []
        return {
            "input": inputs,
            "input_order": {k: list(v) for k, v in inputs.items()},
            "output": [o.io_type for o in outs],
            "output_is_list": [o.is_output_list for o in outs],
            "output_name": [o.display_name or o.io_type for o in outs],
            "output_tooltips": [o.tooltip or None for o in outs],
            "name": self.node_id, "display_name": self.display_name, "category": self.category,
            "description": self.description, "output_node": self.is_output_node, "deprecated": False,
            "experimental": False, "api_node": False,
            "python_module": getattr(cls, "RELATIVE_PYTHON_MODULE", None) or "nodes",
        }


class NodeOutput:
    def __init__(self, *args, ui=None, expand=None, block_execution=None):
        self.args, self.ui, self.expand, self.block_execution = args, ui, expand, block_execution

    @property
    def result(self):
        return self.args if self.args else None

    def __getitem__(self, index):
        return self.args[index]


class ComfyNode:
    hidden = HiddenHolder()
    RELATIVE_PYTHON_MODULE = None

    @classmethod
    @abstractmethod
    def define_schema(cls):
        raise NotImplementedError

    @classmethod
    @abstractmethod
    def execute(cls, **kwargs):
        raise NotImplementedError

    @classmethod
    def GET_SCHEMA(cls):
        schema = cls.define_schema().finalize()
        schema.validate()
        return schema

    @classmethod
    def GET_NODE_INFO_V1(cls):
        return cls.GET_SCHEMA().get_v1_info(cls)

    @classmethod
    def INPUT_TYPES(cls, include_hidden=True):
        inputs = cls.GET_NODE_INFO_V1()["input"]
        if not include_hidden:
            inputs.pop("hidden", None)
        return inputs

    @classmethod
    def PREPARE_CLASS_CLONE(cls, hidden_inputs):
        """As ComfyUI runs a node: a subclass whose ``hidden`` holds the hidden inputs (UNIQUE_ID ...)."""
        return type(f"{cls.__name__}Clone", (cls,), {"hidden": HiddenHolder(hidden_inputs)})


class ComfyExtension(ABC):
    async def on_load(self):
        pass

    @abstractmethod
    async def get_node_list(self):
        ...


class _StandInIO:
    """The names of ``comfy_api.latest.io`` that the pack uses."""
    Schema, NodeOutput, ComfyNode, Hidden, HiddenHolder = Schema, NodeOutput, ComfyNode, Hidden, HiddenHolder
    Int = _type("INT")
    Float = _type("FLOAT")
    String = _type("STRING", {"multiline": False})
    Boolean = _type("BOOLEAN")
    Image = _type("IMAGE")
    Combo = type("COMBO", (), {"io_type": "COMBO", "Input": _ComboInput})

    @staticmethod
    def Custom(io_type):
        return _type(io_type)


io = _StandInIO


def install():
    """This module as ``comfy_api.latest`` in sys.modules unless a real ``comfy_api`` is importable -> the
    ``comfy_api.latest`` module the nodes will use (this one, or None for the real one, not imported here)."""
    if "comfy_api.latest" in sys.modules:
        return sys.modules["comfy_api.latest"]
    if importlib.util.find_spec("comfy_api") is not None:
        return None
    package = types.ModuleType("comfy_api")
    package.__path__, package.latest = [], sys.modules[__name__]
    sys.modules["comfy_api"], sys.modules["comfy_api.latest"] = package, sys.modules[__name__]
    return sys.modules[__name__]
