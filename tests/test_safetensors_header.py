"""`data.safetensors_header`: the one reader of a .safetensors header, which the attention files
of kind `attention` and the resource model's parameter count both read through."""
import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from oattn_lib import resources
from oattn_lib.data import attention_files, safetensors_header
from oattn_lib.data.safetensors_header import SafetensorsHeaderError, read_safetensors_header


def _write(path, header, data: bytes = b"\0" * 64):
    h = json.dumps(header).encode() if not isinstance(header, bytes) else header
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return path


def test_the_header_locates_each_array_as_the_safetensors_library_wrote_it(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {"probs": rng.random((1, 2, 3, 3), dtype=np.float32), "half": rng.random((4, 5)).astype(np.float16),
              "ids": rng.integers(0, 9, (7,)), "mask": rng.random((2, 3)) > 0.5, "empty": np.zeros((0, 3), np.uint8)}
    path = tmp_path / "a.safetensors"
    save_file(arrays, str(path), metadata={"tokens": json.dumps(["a", "b"])})
    h = read_safetensors_header(path)
    raw = path.read_bytes()
    assert set(h.arrays) == set(arrays) and h.metadata == {"tokens": '["a", "b"]'}
    for name, a in arrays.items():
        got = h.arrays[name]
        start, stop = got.offsets
        assert got.shape == a.shape
        assert raw[h.data_start + start:h.data_start + stop] == a.tobytes()
    assert resources.parameter_count([path]) == sum(a.size for a in arrays.values())


MALFORMED = [
    (lambda p: p.write_bytes(b"\x01\0"), r"is not a \.safetensors file \(no JSON header: 2 bytes\)"),
    (lambda p: p.write_bytes(b"\xff" * 8 + b" " * 64), "no JSON header: 72 bytes, whose first 8 give a header of"),
    (lambda p: _write(p, b"{not"), "its header is not JSON"),
    (lambda p: _write(p, [1, 2]), "its header is a JSON list, not an object"),
    (lambda p: _write(p, {"__metadata__": {"tokens": 3}}), "its __metadata__ is not an object of strings"),
    (lambda p: _write(p, {"probs": 7}), "array 'probs': malformed header entry 7"),
    (lambda p: _write(p, {"probs": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}}),
     "array 'probs': dtype 'F33' is not a safetensors dtype"),
    (lambda p: _write(p, {"probs": {"dtype": "F32", "shape": "big", "data_offsets": [0, 64]}}),
     "array 'probs': malformed header entry"),
    (lambda p: _write(p, {"probs": {"dtype": "F32", "shape": [1, 2, 4, 4], "data_offsets": [0, 64]}}),
     r"array 'probs': its header says shape \(1, 2, 4, 4\) \(128 bytes\) at bytes 0\.\.64, the file holds 64 "
     r"after its header \(truncated"),
    (lambda p: _write(p, {"probs": {"dtype": "F32", "shape": [4], "data_offsets": [60, 76]}}),
     r"at bytes 60\.\.76, the file holds 64"),
]


@pytest.mark.parametrize("make, expect", MALFORMED)
def test_a_malformed_header_is_one_error_naming_the_file_whoever_reads_it(tmp_path, make, expect):
    path = tmp_path / "a.safetensors"
    make(path)
    with pytest.raises(SafetensorsHeaderError, match=expect) as err:
        read_safetensors_header(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    # the weights' parameter count and the attention files say the same
    with pytest.raises(ValueError) as counted:
        resources.parameter_count([path])
    assert str(counted.value) == message
    with pytest.raises(attention_files.AttentionFileError) as described:
        attention_files.describe(path)
    assert str(described.value) == message


def test_a_header_longer_than_the_bound_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "a.safetensors"
    save_file({"w": np.zeros(3, np.float32)}, str(path))
    assert read_safetensors_header(path).arrays["w"].shape == (3,)
    monkeypatch.setattr(safetensors_header, "MAX_HEADER_BYTES", 16)
    with pytest.raises(SafetensorsHeaderError, match=r"a\.safetensors: .*more than the 16 a header may have"):
        read_safetensors_header(path)
    # refused unread: a header that is not JSON either is refused for its length
    _write(path, b"x" * 32)
    with pytest.raises(SafetensorsHeaderError, match="a header of 32 bytes, more than the 16"):
        read_safetensors_header(path)
