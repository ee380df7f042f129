"""JUnit XML, which CI systems display: one testsuite per runtime, one testcase per result."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from tconform.files import atomic_write_bytes
from tconform.results import Result


def build(results: list[Result]) -> ET.Element:
    root = ET.Element("testsuites", name="tconform verify")
    suites: dict[str, ET.Element] = {}
    for r in results:
        key = r.runtime if r.runtime != "onnxruntime" else f"onnxruntime-{r.ep}"
        suite = suites.get(key)
        if suite is None:
            suite = suites[key] = ET.SubElement(root, "testsuite", name=key)
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"{key}.{r.case}",
            name=r.input_set,
            time=f"{r.seconds:.4f}",
        )
        if r.model:
            properties = ET.SubElement(case, "properties")
            for key in ("path", "sha256", "origin"):
                ET.SubElement(
                    properties, "property", name=f"model.{key}", value=getattr(r.model, key)
                )
        if r.status in ("fail", "unavailable"):
            ET.SubElement(case, "failure", message=r.message or r.status).text = r.message
        elif r.status == "error":
            ET.SubElement(case, "error", message=r.message).text = r.message
        elif r.status == "skip":
            ET.SubElement(case, "skipped", message=r.message)
    for suite in suites.values():
        cases = list(suite)
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(sum(c.find("failure") is not None for c in cases)))
        suite.set("errors", str(sum(c.find("error") is not None for c in cases)))
        suite.set("skipped", str(sum(c.find("skipped") is not None for c in cases)))
    return root


def write(path: Path, results: list[Result]) -> None:
    tree = ET.ElementTree(build(results))
    ET.indent(tree)
    atomic_write_bytes(path, ET.tostring(tree.getroot(), encoding="utf-8", xml_declaration=True))
