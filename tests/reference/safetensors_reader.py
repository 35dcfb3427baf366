"""Minimal, strict reader for Hugging Face safetensors checkpoints (single file or sharded).

Written from the format description (8-byte little-endian header length, JSON header, raw
little-endian tensor bytes) so the reference does not depend on the `safetensors` package.
Every tensor is upcast exactly to the requested torch float dtype.
"""

import json
import mmap
import os

import numpy as np
import torch


class CheckpointError(Exception):
    """Bad or inconsistent checkpoint input; the message names the file and tensor."""


# safetensors dtype tag -> (bytes per element, little-endian numpy dtype of the raw bits)
_RAW_DTYPES = {
    "BF16": (2, np.dtype("<u2")),
    "F16": (2, np.dtype("<f2")),
    "F32": (4, np.dtype("<f4")),
    "F64": (8, np.dtype("<f8")),
}

# Headers larger than this are certainly corrupt (real ones are a few hundred KiB).
_MAX_HEADER_BYTES = 100 * 1024 * 1024

SINGLE_FILE_NAME = "model.safetensors"
INDEX_FILE_NAME = "model.safetensors.index.json"


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """Exact BF16 -> float32: a bf16 value is the top 16 bits of the float32 with that value."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


class SafetensorsFile:
    """One memory-mapped .safetensors file with a validated header."""

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, "rb") as handle:
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as error:
            raise CheckpointError(f"{path}: cannot map file: {error}") from error
        self.tensors = self._parse_header()

    def close(self) -> None:
        self._map.close()

    def _parse_header(self) -> dict:
        file_size = len(self._map)
        if file_size < 8:
            raise CheckpointError(f"{self.path}: file is {file_size} bytes, shorter than the "
                                  "8-byte header length")
        header_size = int.from_bytes(self._map[:8], "little")
        if header_size > min(_MAX_HEADER_BYTES, file_size - 8):
            raise CheckpointError(f"{self.path}: header length {header_size} does not fit in a "
                                  f"{file_size}-byte file")
        try:
            header = json.loads(self._map[8:8 + header_size].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise CheckpointError(f"{self.path}: header is not valid JSON: {error}") from error
        if not isinstance(header, dict):
            raise CheckpointError(f"{self.path}: header is not a JSON object")
        data_start = 8 + header_size
        data_size = file_size - data_start
        tensors = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            tensors[name] = self._validate_entry(name, entry, data_start, data_size)
        return tensors

    def _validate_entry(self, name: str, entry, data_start: int, data_size: int) -> dict:
        where = f"{self.path}: tensor '{name}'"
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
            raise CheckpointError(f"{where}: header entry lacks dtype/shape/data_offsets")
        dtype = entry["dtype"]
        if dtype not in _RAW_DTYPES:
            raise CheckpointError(f"{where}: unsupported dtype {dtype!r} "
                                  f"(supported: {sorted(_RAW_DTYPES)})")
        shape = entry["shape"]
        offsets = entry["data_offsets"]
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise CheckpointError(f"{where}: bad shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and
                all(isinstance(o, int) for o in offsets) and 0 <= offsets[0] <= offsets[1]):
            raise CheckpointError(f"{where}: bad data_offsets {offsets!r}")
        if offsets[1] > data_size:
            raise CheckpointError(f"{where}: data_offsets {offsets} run past the end of the "
                                  f"{data_size}-byte data section")
        element_count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        expected_bytes = element_count * _RAW_DTYPES[dtype][0]
        if offsets[1] - offsets[0] != expected_bytes:
            raise CheckpointError(f"{where}: {offsets[1] - offsets[0]} bytes for shape {shape} "
                                  f"{dtype}, expected {expected_bytes}")
        return {"dtype": dtype, "shape": shape, "offset": data_start + offsets[0],
                "count": element_count}

    def load(self, name: str, out_dtype: torch.dtype) -> torch.Tensor:
        """Returns a copy of tensor `name` converted exactly to `out_dtype`."""
        entry = self.tensors[name]
        raw_dtype = _RAW_DTYPES[entry["dtype"]][1]
        raw = np.frombuffer(self._map, dtype=raw_dtype, count=entry["count"],
                            offset=entry["offset"])
        values = bf16_bits_to_float32(raw) if entry["dtype"] == "BF16" else raw
        return torch.from_numpy(values.astype(np.float64)).to(out_dtype).reshape(entry["shape"])


class Checkpoint:
    """All tensors of a HF model folder: model.safetensors or a sharded index."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        index_path = os.path.join(model_dir, INDEX_FILE_NAME)
        single_path = os.path.join(model_dir, SINGLE_FILE_NAME)
        if os.path.exists(index_path):
            shard_of = self._read_index(index_path)
        elif os.path.exists(single_path):
            shard_of = None
        else:
            raise CheckpointError(f"{model_dir}: neither {SINGLE_FILE_NAME} nor "
                                  f"{INDEX_FILE_NAME} exists")
        shard_names = sorted(set(shard_of.values())) if shard_of else [SINGLE_FILE_NAME]
        self._files = {}
        try:
            for shard in shard_names:
                self._files[shard] = SafetensorsFile(os.path.join(model_dir, shard))
        except CheckpointError:
            self.close()
            raise
        self._location = {}
        for shard, handle in self._files.items():
            for name in handle.tensors:
                if name in self._location:
                    raise CheckpointError(f"{model_dir}: tensor '{name}' appears in both "
                                          f"{self._location[name]} and {shard}")
                self._location[name] = shard
        if shard_of:
            for name, shard in shard_of.items():
                if self._location.get(name) != shard:
                    raise CheckpointError(f"{index_path}: tensor '{name}' is mapped to {shard} "
                                          "but that shard does not hold it")

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files = {}

    @staticmethod
    def _read_index(index_path: str) -> dict:
        try:
            with open(index_path, encoding="utf-8") as handle:
                index = json.load(handle)
        except (OSError, json.JSONDecodeError) as error:
            raise CheckpointError(f"{index_path}: cannot read index: {error}") from error
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index_path}: missing or empty 'weight_map'")
        for name, shard in weight_map.items():
            if not isinstance(shard, str) or os.path.basename(shard) != shard:
                raise CheckpointError(f"{index_path}: tensor '{name}' maps to bad shard "
                                      f"{shard!r}")
        return weight_map

    def names(self) -> set:
        return set(self._location)

    def dtype_of(self, name: str) -> str:
        return self._files[self._location[name]].tensors[name]["dtype"]

    def shape_of(self, name: str) -> list:
        return self._files[self._location[name]].tensors[name]["shape"]

    def load(self, name: str, out_dtype: torch.dtype) -> torch.Tensor:
        if name not in self._location:
            raise CheckpointError(f"{self.model_dir}: tensor '{name}' is missing")
        return self._files[self._location[name]].load(name, out_dtype)
