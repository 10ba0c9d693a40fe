"""Safetensors and Hugging Face folders in plain Python + torch (no `safetensors` or
`transformers` import), for the reference models of the cross-check.

A safetensors file is an 8-byte little-endian header length, a JSON header naming every
tensor's dtype, shape and [begin, end) byte range in the data section, then the data.
"""

import json
import os
import struct

import torch

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class FormatError(RuntimeError):
    pass


def read_header(path):
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise FormatError(f"{path}: shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", raw)
        size = os.path.getsize(path)
        if n > size - 8:
            raise FormatError(f"{path}: header length {n} exceeds the file size {size}")
        header = json.loads(f.read(n))
    return header, 8 + n


def read_safetensors(path):
    """name -> tensor (CPU), every tensor of the file."""
    header, data_start = read_header(path)
    header.pop("__metadata__", None)
    with open(path, "rb") as f:
        blob = f.read()
    out = {}
    for name, e in header.items():
        if e["dtype"] not in _DTYPES:
            raise FormatError(f"{path}: tensor {name} has dtype {e['dtype']}, not readable here")
        begin, end = e["data_offsets"]
        dt = _DTYPES[e["dtype"]]
        chunk = bytearray(blob[data_start + begin : data_start + end])
        count = 1
        for d in e["shape"]:
            count *= d
        t = torch.frombuffer(chunk, dtype=dt, count=count) if count > 0 else torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"]).clone()
    return out


def write_safetensors(path, tensors, metadata=None):
    """Writes name -> tensor (any device; written as stored, contiguous) in sorted name order."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype not in _NAMES:
            raise FormatError(f"tensor {name}: dtype {t.dtype} has no safetensors name here")
        data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


def load_hf_folder(folder):
    """(config dict, name -> tensor) of an HF model folder: config.json plus either
    model.safetensors.index.json and its shards, or one model.safetensors."""
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    index = os.path.join(folder, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        for shard in sorted(set(weight_map.values())):
            part = read_safetensors(os.path.join(folder, shard))
            for name in part:
                if weight_map.get(name) != shard:
                    raise FormatError(f"{folder}: {name} is in {shard} but the index says "
                                      f"{weight_map.get(name)}")
            tensors.update(part)
        missing = set(weight_map) - set(tensors)
        if missing:
            raise FormatError(f"{folder}: index names tensors no shard holds: {sorted(missing)[:5]}")
    else:
        tensors = read_safetensors(os.path.join(folder, "model.safetensors"))
    return config, tensors
