"""The repro bundle of a runtime that crashed: the model and the inputs it crashed on, a script
that runs them on that runtime in that interpreter, and a README saying what happened.

    reports/verify.crash-3k2j1h/
        model.onnx                    the model that ran (linked where it can be, else copied)
        test_data_set_0/input_K.pb    the inputs it was fed (ONNX test-data layout; none where it
                                      crashed opening the model)
        reproduce.py                  the same session, outside tconform
        README.md, bundle.json        what crashed, how, with which versions, and the command

Each bundle is a new folder beside the command's reports (`crash_folder`'s parent, its name the
prefix), never one that exists: tconform writes only what it made.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from tconform.files import new_folder

MARKER = "bundle.json"


def write_crash_bundle(
    crash_folder: Path,
    about: Mapping[str, object],
    model: Path,
    external_data: Sequence[str],
    feeds: Mapping[str, np.ndarray] | None,
) -> Path:
    """A new bundle folder named after `crash_folder` (e.g. reports/verify.crash-XXXX). `about`:
    the runtime's spec and settings, the interpreter, the message, the command."""
    from onnx import numpy_helper

    crash_folder.parent.mkdir(parents=True, exist_ok=True)
    folder = new_folder(crash_folder.parent, f"{crash_folder.name}-")
    _place(model, folder / "model.onnx")
    for location in external_data:  # names read from the model: kept inside the bundle
        target = (folder / location).resolve()
        if folder.resolve() in target.parents:
            target.parent.mkdir(parents=True, exist_ok=True)
            _place(model.parent / location, target)
    if feeds is not None:
        data = folder / "test_data_set_0"
        data.mkdir()
        for k, (name, value) in enumerate(feeds.items()):
            tensor = numpy_helper.from_array(np.asarray(value), name=name)
            (data / f"input_{k}.pb").write_bytes(tensor.SerializeToString())
    record = {"tool": "tconform crash bundle", **about, "inputs": list(feeds or {})}
    (folder / MARKER).write_text(json.dumps(record, indent=2, default=str) + "\n")
    (folder / "reproduce.py").write_text(_REPRODUCE)
    (folder / "README.md").write_text(_readme(about, feeds is not None))
    return folder


def _place(source: Path, target: Path) -> None:
    """A copy of `source` at `target`: never a hard link, which would make an edit of the
    disposable bundle an edit of the model under test."""
    shutil.copyfile(source, target)


def _readme(about: Mapping[str, object], with_inputs: bool) -> str:
    python = about.get("python")
    versions = about.get("versions") or {}
    lines = [
        f"# Crash: `{about.get('runtime')}`",
        "",
        f"{about.get('message')}",
        "",
        f"- model: `model.onnx` (sha256 `{about.get('sha256')}`, from `{about.get('model')}`)",
        "- inputs: "
        + (
            "`test_data_set_0/input_K.pb` (ONNX test-data layout)"
            if with_inputs
            else "none: it crashed opening the model"
        ),
        "- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        f"- command: `{about.get('command')}`",
        "",
        "## Reproduce",
        "",
        "In the interpreter that crashed (it holds the runtime at that version):",
        "",
        "```",
        f"{python} reproduce.py",
        "```",
        "",
        "`reproduce.py` opens the model as tconform's worker did (the settings in `bundle.json`) "
        "and runs it on the inputs; it crashes as the worker did, or prints the outputs' shapes.",
        "",
    ]
    return "\n".join(lines)


_REPRODUCE = '''"""Open model.onnx as tconform's worker did (bundle.json's settings) and run it on
test_data_set_0's inputs, outside tconform."""

import json
from pathlib import Path

import onnx
from onnx import numpy_helper

here = Path(__file__).resolve().parent
about = json.loads((here / "bundle.json").read_text())
settings = about.get("settings", {})
feeds = {}
for path in sorted((here / "test_data_set_0").glob("input_*.pb")):
    tensor = onnx.TensorProto()
    tensor.ParseFromString(path.read_bytes())
    feeds[tensor.name] = numpy_helper.to_array(tensor)
model = str(here / "model.onnx")
runtime = about["runtime_name"]
if runtime == "onnxruntime":
    import onnxruntime as ort

    options = ort.SessionOptions()
    levels = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
              "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}
    level = levels[settings.get("graph_optimization", "all")]
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.intra_op_num_threads = int(settings.get("intra_op_threads", 0))
    for key, value in settings.get("session_config", {}).items():
        options.add_session_config_entry(key, value)
    provider = settings.get("provider", "CPUExecutionProvider")
    session = ort.InferenceSession(model, options, providers=[provider])
    print("opened with", session.get_providers())
    outputs = session.run(None, feeds) if feeds else []
elif runtime == "openvino":
    import openvino as ov

    compiled = ov.Core().compile_model(model, settings.get("device", "CPU"), settings["config"])
    print("compiled on", settings.get("device", "CPU"))
    outputs = list(compiled(feeds).values()) if feeds else []
else:
    from onnx.reference import ReferenceEvaluator

    outputs = ReferenceEvaluator(onnx.load(model)).run(None, feeds) if feeds else []
for k, value in enumerate(outputs):
    print(f"output {k}: shape {list(value.shape)}, dtype {value.dtype}")
'''
