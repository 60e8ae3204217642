"""A host copy's tensors read back onto a GPU through the pinned buffers: every byte of
tensors larger than a buffer, of other dtypes, of a scalar and into a strided destination."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnnvl.runtime import copyfile, hostcopy

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_a_host_copy_reads_back_onto_the_gpu_byte_for_byte(tmp_path: Path) -> None:
    big = torch.randn(3 * copyfile._CHUNK // 2 + 7, dtype=torch.bfloat16)  # three buffers' worth
    state = {"big": big, "f32": torch.randn(33, 17), "step": torch.tensor(12.0), "lr": 0.5}
    path = tmp_path / "copy"
    copyfile.write_file(path, {"meta": {"step": 12}}, state)
    header = copyfile.read_header(path)
    assert header["meta"] == {"step": 12} and header["state"]["lr"] == 0.5
    into = {
        "big": torch.empty_like(big, device="cuda"),
        "f32": torch.empty(17, 33, device="cuda").t(),  # strided: read through a contiguous one
        "step": torch.empty((), device="cuda"),
        "lr": 0.0,
    }
    got = hostcopy.fill(into, header["state"], path)
    assert got["lr"] == 0.5
    for key in ("big", "f32", "step"):
        assert torch.equal(into[key].cpu(), state[key]), key
