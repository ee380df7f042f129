"""JUnit XML, which CI systems display: one testsuite per runtime, one testcase per result.

A failure or runtime error is `<failure>`/`<error>`; an unavailable provider is `<skipped>` with
its reason (an environment fact, exit 3, not a conformance failure); an error that ended the run
early is one more testcase with `<error>`. The environment block is the `<properties>` of the
root, and each testcase names its model in its own `<properties>`.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from tconform.files import atomic_write_bytes
from tconform.report import RunReport
from tconform.runtimes.labels import runtime_label


def _properties(parent: ET.Element, values: dict[str, object]) -> None:
    properties = ET.SubElement(parent, "properties")
    for name, value in values.items():
        text = value if isinstance(value, str) else json.dumps(value)
        ET.SubElement(properties, "property", name=name, value=text)


def build(report: RunReport) -> ET.Element:
    root = ET.Element("testsuites", name=f"tconform {report.command}")
    facts = dict(report.environment or {})  # tconform's own; a worker's runtime is its own
    facts.update({f"worker.{name}": line for name, line in report.worker_runtimes().items()})
    if facts:
        _properties(root, facts)
    suites: dict[str, ET.Element] = {}
    for r in report.results:
        key = runtime_label(r.runtime, r.ep, r.precision)
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
        facts = (
            {f"model.{k}": getattr(r.model, k) for k in ("path", "sha256", "origin")}
            if r.model
            else {}
        )
        if r.reference != "float64":  # judged against a weaker reference: say which
            facts["reference"] = r.reference
        if facts:
            _properties(case, facts)
        if r.status == "fail":
            ET.SubElement(case, "failure", message=r.message or r.status).text = r.message
        elif r.status in ("error", "crash"):
            ET.SubElement(case, "error", message=r.message).text = r.message
        elif r.status in ("skip", "unavailable"):
            ET.SubElement(case, "skipped", message=f"{r.status}: {r.message}")
    if report.error is not None:
        suite = ET.SubElement(root, "testsuite", name="tconform")
        case = ET.SubElement(suite, "testcase", classname="tconform", name=report.command)
        message = str(report.error["message"])
        ET.SubElement(case, "error", message=message).text = message
        suites["tconform"] = suite
    for suite in suites.values():
        cases = suite.findall("testcase")
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(sum(c.find("failure") is not None for c in cases)))
        suite.set("errors", str(sum(c.find("error") is not None for c in cases)))
        suite.set("skipped", str(sum(c.find("skipped") is not None for c in cases)))
    return root


def is_own(path: Path) -> bool:
    """Whether `path` holds JUnit XML tconform wrote (so replacing it loses nothing)."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError):
        return False
    return root.tag == "testsuites" and root.get("name", "").startswith("tconform ")


# What XML 1.0 cannot hold, even escaped: control characters but tab and newlines, lone
# surrogates, U+FFFE and U+FFFF. A runtime's or the user's message can carry them (a terminal
# colour code); ElementTree would write them as they are, and no parser reads the file.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_safe(text: str) -> str:
    return _NOT_XML.sub(
        lambda m: m.group().encode("unicode_escape", "backslashreplace").decode(), text
    )


def write(path: Path, report: RunReport) -> None:
    tree = ET.ElementTree(build(report))
    for element in tree.iter():  # each character XML cannot hold, as its escape sequence
        if element.text:
            element.text = _xml_safe(element.text)
        for name, value in element.attrib.items():
            element.set(name, _xml_safe(value))
    ET.indent(tree)
    atomic_write_bytes(path, ET.tostring(tree.getroot(), encoding="utf-8", xml_declaration=True))
