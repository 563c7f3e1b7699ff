"""`ai-factory check --format json|sarif|junit`: check results for CI systems and code review.

Every finding is located twice when it can be: in the stack file, at the line of the config that
caused it (the tenant's entry for a tenant's object, the pool's for a node of the pool, the layer's
settings for a platform layer's object), and in the rendered file of its object (under the
directory `render` writes, or the rendered directory that was checked). SARIF puts the stack-file
line first (code review annotates the config, which is what a reviewer can change) and the rendered
file as a related location; a finding with no known config cause points at the rendered file.
Configuration problems (exit status 2) are reported in the same format, each at its line.

Output is deterministic: the same findings give the same bytes.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Iterable

from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.model.loading import line_of, stack_file_lines
from ai_factory.factory.planning.placement import POOL_LABEL
from ai_factory.factory.rendering.bundle import Manifest, Rendered

FORMATS = ("text", "json", "sarif", "junit")
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
TOOL = "ai-factory"
CONFIG_RULE = "config"
"""The rule of configuration problems (the run stopped before rendering)."""


@dataclass(frozen=True)
class Location:
    file: str
    """Relative to the working directory when inside it, else absolute (POSIX separators)."""
    line: int | None = None


@dataclass(frozen=True)
class Located:
    check: str
    ref: str
    message: str
    tenants: tuple[str, ...]
    config: Location | None
    rendered: Location | None

    @property
    def text(self) -> str:
        return f"{self.ref}: {self.message}" if self.ref and self.ref != "-" else self.message


def locate(findings: Iterable[Finding], rendered: Rendered, rendered_dir: Path, stack: Path | None) -> list[Located]:
    """Each finding with its config line (when `stack` is the stack file it was rendered from) and
    its rendered file (under `rendered_dir`)."""
    by_ref: dict[str, Manifest] = {}
    for m in rendered.manifests:
        by_ref.setdefault(m.ref, m)
        by_ref.setdefault(m.origin, m)  # policy findings name the Pulumi resource (`type::name`)
    lines = stack_file_lines(stack) if stack is not None else {}
    tenant_index = {t.name: i for i, t in enumerate(rendered.config.tenants)} if rendered.config else {}
    pool_index = {p.name: i for i, p in enumerate(rendered.config.fleet.pools)} if rendered.config else {}
    located = []
    for f in findings:
        m = by_ref.get(f.ref)
        config = None
        if stack is not None:
            path = _config_path(f, m, tenant_index, pool_index)
            line = line_of(lines, path) if path else None
            config = Location(_display(stack), line) if line else None
        file = Location(_display(rendered_dir / m.path)) if m is not None else None
        located.append(Located(f.check, f.ref, f.message, f.tenants, config, file))
    return located


def _config_path(f: Finding, m: Manifest | None, tenants: dict[str, int], pools: dict[str, int]) -> str | None:
    """The config that made the object: its tenant's entry, its pool's, or its layer's settings."""
    tenant = next((t for t in f.tenants if t in tenants), None) or (m.tenant if m is not None else None)
    if tenant in tenants:
        return f"tenants[{tenants[tenant]}]"
    if m is None:
        return None
    pool = ((m.obj.get("metadata") or {}).get("labels") or {}).get(POOL_LABEL)
    if pool in pools:
        return f"fleet.pools[{pools[pool]}]"
    return f"layers.{m.layer.replace('-', '_')}"


def config_problems(problems: Iterable[str], stack: Path | None) -> list[Located]:
    """`ConfigError` problems (`path: message`) located at their line of the stack file."""
    lines = stack_file_lines(stack) if stack is not None and stack.is_file() else {}
    located = []
    for problem in problems:
        path, sep, message = problem.partition(": ")
        line = line_of(lines, path) if sep else None
        config = Location(_display(stack), line) if stack is not None else None
        located.append(Located(CONFIG_RULE, path if sep else "", message if sep else problem, (), config, None))
    return located


def _display(path: Path) -> str:
    resolved = path.resolve()
    try:
        return resolved.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return resolved.as_posix()


# --------------------------------------------------------------------------- formats


def render_report(fmt: str, results: list[Located], target: str, objects: int | None, not_run: Iterable[str] = ()) -> str:
    """`not_run`: the check families that could not run, one line each (the check is incomplete)."""
    return {"json": to_json, "sarif": to_sarif, "junit": to_junit}[fmt](results, target, objects, list(not_run))


def to_json(results: list[Located], target: str, objects: int | None, not_run: list[str] = ()) -> str:
    def where(location: Location | None) -> dict | None:
        return None if location is None else {"file": location.file, "line": location.line}

    document = {
        "tool": TOOL,
        "version": _version(),
        "target": target,
        "objects": objects,
        "not_run": list(not_run),
        "findings": [
            {"check": r.check, "object": r.ref, "message": r.message, "tenants": list(r.tenants), "config": where(r.config), "rendered": where(r.rendered)}
            for r in results
        ],
    }
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def to_sarif(results: list[Located], target: str, objects: int | None, not_run: list[str] = ()) -> str:
    rules = sorted({r.check for r in results})
    index = {rule: i for i, rule in enumerate(rules)}
    sarif_results = []
    for r in results:
        locations = [loc for loc in (r.config, r.rendered) if loc is not None]
        result: dict = {
            "ruleId": r.check,
            "ruleIndex": index[r.check],
            "level": "error",
            "message": {"text": r.text},
            "properties": {"object": r.ref, "tenants": list(r.tenants)},
        }
        if locations:
            result["locations"] = [_sarif_location(locations[0])]
        if len(locations) > 1:
            result["relatedLocations"] = [{"id": i, **_sarif_location(loc)} for i, loc in enumerate(locations[1:])]
        sarif_results.append(result)
    run = {
        "tool": {"driver": {"name": TOOL, "version": _version(), "rules": [{"id": rule, "name": rule} for rule in rules]}},
        "invocations": [
            {
                "executionSuccessful": True,
                "properties": {"target": target, "objects": objects},
                "toolExecutionNotifications": [{"level": "warning", "message": {"text": f"not run: {line}"}} for line in not_run],
            }
        ],
        "results": sarif_results,
    }
    return json.dumps({"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2, sort_keys=True) + "\n"


def _sarif_location(location: Location) -> dict:
    physical: dict = {"artifactLocation": {"uri": location.file if not os.path.isabs(location.file) else Path(location.file).as_uri()}}
    if location.line:
        physical["region"] = {"startLine": location.line}
    return {"physicalLocation": physical}


def to_junit(results: list[Located], target: str, objects: int | None, not_run: list[str] = ()) -> str:
    """One test suite per check with findings, one failing test case per finding (named for its
    object); a clean check run is one suite with one passing case; each check family that could
    not run is a skipped case."""
    tests = max(len(results), 1) + len(not_run)
    suites = ET.Element("testsuites", name=f"{TOOL} check {target}", tests=str(tests), failures=str(len(results)), skipped=str(len(not_run)))
    by_check: dict[str, list[Located]] = {}
    for r in results:
        by_check.setdefault(r.check, []).append(r)
    if not results:
        suite = ET.SubElement(suites, "testsuite", name=f"{TOOL} check", tests="1", failures="0", errors="0")
        ET.SubElement(suite, "testcase", classname=TOOL, name=f"{objects} objects checked")
    for check, found in sorted(by_check.items()):
        suite = ET.SubElement(suites, "testsuite", name=check, tests=str(len(found)), failures=str(len(found)), errors="0")
        for r in found:
            attrs = {"classname": check, "name": r.ref or check}
            where = r.config or r.rendered
            if where is not None:
                attrs["file"] = where.file
                if where.line:
                    attrs["line"] = str(where.line)
            case = ET.SubElement(suite, "testcase", **attrs)
            failure = ET.SubElement(case, "failure", message=r.message, type=check)
            failure.text = "\n".join(
                [r.text]
                + ([f"tenants: {', '.join(r.tenants)}"] if r.tenants else [])
                + [f"{what}: {loc.file}" + (f":{loc.line}" if loc.line else "") for what, loc in (("config", r.config), ("rendered", r.rendered)) if loc]
            )
    if not_run:
        suite = ET.SubElement(suites, "testsuite", name="not run", tests=str(len(not_run)), failures="0", errors="0", skipped=str(len(not_run)))
        for line in not_run:
            case = ET.SubElement(suite, "testcase", classname=TOOL, name=line.split(":", 1)[0])
            ET.SubElement(case, "skipped", message=line)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _version() -> str:
    try:
        return metadata.version("ai-factory")
    except metadata.PackageNotFoundError:
        return "0"
