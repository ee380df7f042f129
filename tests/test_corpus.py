"""A corpus of corrupted and hostile inputs, generated fresh, run through verify, golden --check
and doc: each must end in one line on stderr, the documented exit code, and no traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tconform.files import sha256_bytes

pytestmark = pytest.mark.integration

NORM_OUT = Path("norm") / "test_data_set_1" / "output_0.pb"
NORM_REL = "test_data_set_1/output_0.pb"


def _manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def _save_manifest(root: Path, data) -> None:
    (root / "manifest.json").write_text(json.dumps(data))


def _rehash(golden: Path, data: bytes) -> None:
    """Write `data` as norm's output and record its sha256, so only validation can object."""
    (golden / NORM_OUT).write_bytes(data)
    manifest = _manifest(golden)
    manifest["cases"]["norm"]["sha256"][NORM_REL] = sha256_bytes(data)
    _save_manifest(golden, manifest)


def flip_byte(ws):
    data = bytearray((ws["golden"] / NORM_OUT).read_bytes())
    data[len(data) // 2] ^= 0x5A
    (ws["golden"] / NORM_OUT).write_bytes(bytes(data))


def truncate_tensor(ws):
    path = ws["golden"] / NORM_OUT
    path.write_bytes(path.read_bytes()[:9])


def empty_tensor(ws):
    (ws["golden"] / NORM_OUT).write_bytes(b"")


def wrong_dtype(ws):
    array = numpy_helper.to_array(onnx.load_tensor(str(ws["golden"] / NORM_OUT)))
    _rehash(
        ws["golden"], numpy_helper.from_array(array.astype(np.float64), "out").SerializeToString()
    )


def oversized_header(ws):
    tensor = onnx.TensorProto(name="out", data_type=onnx.TensorProto.FLOAT, dims=[2**40])
    tensor.raw_data = b"\0" * 16  # claims a trillion elements, holds four
    _rehash(ws["golden"], tensor.SerializeToString())


def garbage_tensor(ws):
    _rehash(ws["golden"], b"\x0a\xff\xff\xff\xff\x0f garbage")


def truncated_manifest(ws):
    path = ws["golden"] / "manifest.json"
    path.write_text(path.read_text()[:200])


def manifest_is_a_list(ws):
    (ws["golden"] / "manifest.json").write_text("[1, 2, 3]")


def manifest_is_a_folder(ws):
    path = ws["golden"] / "manifest.json"
    path.unlink()
    path.mkdir()


def manifest_is_dev_zero(ws):
    path = ws["golden"] / "manifest.json"
    path.unlink()
    path.symlink_to("/dev/zero")


def escaping_set_name(ws):
    manifest = _manifest(ws["golden"])
    manifest["cases"]["norm"]["sets"]["../../etc"] = {"x": [1]}
    _save_manifest(ws["golden"], manifest)


def absolute_file_name(ws):
    manifest = _manifest(ws["golden"])
    manifest["cases"]["norm"]["sha256"]["/etc/passwd"] = "0" * 64
    _save_manifest(ws["golden"], manifest)


def case_folder_escapes(ws):
    folder = ws["golden"] / "norm"
    outside = folder.parent.parent / "outside"
    folder.rename(outside)
    folder.symlink_to("/etc")


def extra_set_folder(ws):
    extra = ws["golden"] / "norm" / "test_data_set_9" / "input_0.pb"
    extra.parent.mkdir()
    extra.write_bytes(b"")


def case_with_number(ws):
    manifest = _manifest(ws["golden"])
    manifest["cases"]["norm"] = 5
    _save_manifest(ws["golden"], manifest)


def case_inputs_not_names(ws):
    manifest = _manifest(ws["golden"])
    manifest["cases"]["norm"]["inputs"] = 5
    manifest["cases"]["norm"]["outputs"] = None
    _save_manifest(ws["golden"], manifest)


def tolerances_not_a_table(ws):
    manifest = _manifest(ws["golden"])
    manifest["tolerances"] = "x"
    _save_manifest(ws["golden"], manifest)


def tolerance_out_of_range(ws):
    manifest = _manifest(ws["golden"])
    manifest["tolerances"]["float32/component"]["atol"] = float("nan")
    _save_manifest(ws["golden"], manifest)


def tolerance_a_boolean(ws):
    manifest = _manifest(ws["golden"])
    manifest["tolerances"]["float32/component"]["rtol"] = True  # JSON's true: no number
    _save_manifest(ws["golden"], manifest)


def model_flipped(ws):
    path = ws["artifacts"] / "norm" / "model.onnx"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))


def model_fifo(ws):
    path = ws["artifacts"] / "norm" / "model.onnx"
    path.unlink()
    os.mkfifo(path)


def artifacts_manifest_garbage(ws):
    (ws["artifacts"] / "manifest.json").write_text("{not json")


def doc_manifest_garbage(ws):
    folder = ws["artifacts"] / "doc" / "tiny"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text('{"models": {"norm": {"path": "../../../x"}}}')


def artifacts_path_escapes(ws):
    manifest = _manifest(ws["artifacts"])
    manifest["models"]["norm"]["path"] = "/etc/passwd"
    _save_manifest(ws["artifacts"], manifest)


# (corruption, exit code of `verify --case norm`, of `golden --check`, of `doc`); None: not run.
CORPUS = [
    (flip_byte, 2, 2, None),
    (truncate_tensor, 2, 2, None),
    (empty_tensor, 2, 2, None),
    (wrong_dtype, 2, 2, None),
    (oversized_header, 2, 2, None),
    (garbage_tensor, 2, 2, None),
    (truncated_manifest, 2, 2, None),
    (manifest_is_a_list, 2, 2, None),
    (manifest_is_a_folder, 2, 2, None),
    (manifest_is_dev_zero, 2, 2, None),
    (escaping_set_name, 2, 2, None),
    (absolute_file_name, 2, 2, None),
    (case_folder_escapes, 2, 2, None),
    (extra_set_folder, 2, 2, None),
    (case_with_number, 2, 2, None),
    (case_inputs_not_names, 2, 2, None),
    (tolerances_not_a_table, 2, 2, None),
    (tolerance_out_of_range, 2, 2, None),
    (tolerance_a_boolean, 2, 2, None),
    (model_flipped, 2, 0, None),
    (model_fifo, 2, 0, None),
    (artifacts_manifest_garbage, 2, 0, None),
    (artifacts_path_escapes, 2, 0, None),
    (doc_manifest_garbage, 0, 0, 2),
]


@pytest.mark.parametrize(
    ("corrupt", "verify_code", "check_code", "doc_code"),
    CORPUS,
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_corrupt_input_is_one_line_and_the_documented_exit_code(
    cli, workspace, corrupt, verify_code, check_code, doc_code
):
    corrupt(workspace)
    runs = [
        (
            ("verify", "--golden", str(workspace["golden"]), "--artifacts",
             str(workspace["artifacts"]), "--case", "norm", "--no-doc", "-q"),
            verify_code,
        ),
        (("golden", "--check", "--out", str(workspace["golden"])), check_code),
    ]  # fmt: skip
    if doc_code is not None:
        runs.append((("doc", "--artifacts", str(workspace["artifacts"]), "-q"), doc_code))
    for args, expected in runs:
        code, out, err = cli(*args)
        assert code == expected, (args[0], out, err)
        assert "Traceback" not in out + err
        if expected == 2:
            assert len(err.strip().splitlines()) == 1, (args[0], err)
            assert err.startswith("tconform: error: ")
