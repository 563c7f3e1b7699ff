"""Mutation testing of the checks and policies: do their tests notice a small injected bug?

    python benchmarks/mutation.py [--module NAME ...] [--seed N] [--limit N] [--jobs N]
                                  [--operators OP,...] [--index I,...] [--list] [--timeout S]

Each mutant is one small change to one module (a flipped comparison, `any` for `all`, `and` for
`or`, a name dropped from a literal list, a negated condition, an integer off by one, a `not`
removed, a return value replaced, a finding no longer yielded, a compared string changed...). For
each, only the test files that exercise the module run (`pytest -x`); a failing run kills the
mutant, a passing one lets it survive (passing means pytest finished its session: a mutant that
ends the test process early, even with status 0, is killed). It prints the kill rate per module
and every survivor (file:line, operator, before -> after); a survivor is a behaviour no test pins
down, unless the change cannot alter any output (an equivalent mutant).

No file is ever rewritten: the test process imports the mutated module from memory (an import
hook installed by this file as a pytest plugin, `-p benchmarks.mutation`, reading
`AIF_MUTANT=<module>:<index>`), so a run interrupted at any point leaves the tree as it was and
several mutants can run side by side (`--jobs`). Slow (about 10 s a mutant): not run in CI; run it
on the module you change, with a `--limit`, before and after changing a check.
"""

from __future__ import annotations

import argparse
import ast
import copy
import importlib.abc
import importlib.util
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

REPO = Path(__file__).resolve().parent.parent
ENV = "AIF_MUTANT"
FINISHED = "AIF_MUTANT_FINISHED"
"""Where the test process writes its exit status once pytest finished its session."""

MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    # short name: (source file, the test files that exercise it; fastest first, they run with -x)
    "isolation": ("factory/checking/isolation.py", ("tests/test_isolation.py",)),
    "scheduling": ("factory/checking/scheduling.py", ("tests/test_scheduling.py",)),
    "gpu": ("policies/aif_policies/gpu.py", ("tests/test_policies.py", "tests/test_policy_pack.py")),
    "security": ("policies/aif_policies/security.py", ("tests/test_policies.py", "tests/test_policy_pack.py")),
}
PACKAGE_DIRS = {"factory": "ai_factory.factory", "components": "ai_factory.components", "stacks": "ai_factory.stacks", "policies": "ai_factory.policies"}
"""pyproject.toml's package-dir: where each source directory is imported from."""


def module_name(source: str) -> str:
    top, _, rest = source.removesuffix(".py").partition("/")
    return f"{PACKAGE_DIRS[top]}.{rest.replace('/', '.')}"


def module_spec(text: str) -> str:
    """A `--module` argument: a known short name, or `source=test,...` registered under its source."""
    if text in MODULES:
        return text
    source, _, tests = text.partition("=")
    if not tests or not (REPO / source).is_file() or source.partition("/")[0] not in PACKAGE_DIRS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected one of {', '.join(sorted(MODULES))} or SOURCE=TEST[,TEST...]")
    missing = [t for t in tests.split(",") if not (REPO / t).is_file()]
    if missing:
        raise argparse.ArgumentTypeError(f"{text!r}: no test file {', '.join(missing)}")
    MODULES[source] = (source, tuple(tests.split(",")))
    return source


# --------------------------------------------------------------------------- mutation operators

COMPARE_SWAPS: dict[type, tuple[type, ...]] = {
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.Lt: (ast.LtE, ast.GtE),
    ast.LtE: (ast.Lt, ast.Gt),
    ast.Gt: (ast.GtE, ast.LtE),
    ast.GtE: (ast.Gt, ast.Lt),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
    ast.Is: (ast.IsNot,),
    ast.IsNot: (ast.Is,),
}
OPERATORS = ("compare", "boolop", "any-all", "not", "negate", "int", "drop", "return", "yield", "continue", "string", "arith")


@dataclass(frozen=True)
class Mutant:
    index: int
    operator: str
    line: int
    before: str
    after: str


@dataclass
class _Site:
    operator: str
    node: ast.AST
    replacement: Callable[[], ast.AST | None]
    """Builds the node that takes `node`'s place (None: the statement becomes `pass`)."""


def _constant_like(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (str, int, float)) and not isinstance(node.value, bool)
    return isinstance(node, ast.Tuple) and all(_constant_like(e) for e in node.elts)


def _annotation_nodes(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        parts: list[ast.AST | None] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(node.returns)
            args = node.args
            parts += [a.annotation for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a]
        elif isinstance(node, ast.AnnAssign):
            parts.append(node.annotation)
        for part in parts:
            if part is not None:
                ids |= {id(n) for n in ast.walk(part)}
    return ids


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for stmt in body:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                    ids.add(id(stmt.value))
    return ids


def _in_generator(tree: ast.AST) -> set[int]:
    """Return statements of generator functions (their value is no result anyone reads)."""
    ids = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            own = [n for n in ast.walk(fn) if not (n is not fn and isinstance(n, (ast.FunctionDef, ast.Lambda)))]
            if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in own):
                ids |= {id(n) for n in own if isinstance(n, ast.Return)}
    return ids


def _sites(tree: ast.AST) -> Iterator[_Site]:
    """Every mutation of a module, in a fixed order (the same for the same source)."""
    skip = _annotation_nodes(tree) | _docstrings(tree)
    generator_returns = _in_generator(tree)
    compared_strings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            compared_strings |= {id(n) for n in [node.left, *node.comparators] if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                for new in COMPARE_SWAPS.get(type(op), ()):
                    def swap(node=node, i=i, new=new):
                        mutated = copy.deepcopy(node)
                        mutated.ops[i] = new()
                        return mutated
                    yield _Site("compare", node, swap)
        elif isinstance(node, ast.BoolOp):
            other = ast.Or if isinstance(node.op, ast.And) else ast.And
            yield _Site("boolop", node, lambda node=node, other=other: ast.BoolOp(op=other(), values=copy.deepcopy(node.values)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("any", "all"):
            def flip(node=node):
                mutated = copy.deepcopy(node)
                mutated.func.id = "all" if node.func.id == "any" else "any"
                return mutated
            yield _Site("any-all", node, flip)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield _Site("not", node, lambda node=node: copy.deepcopy(node.operand))
        elif isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            for delta in (1, -1):
                yield _Site("int", node, lambda node=node, delta=delta: ast.Constant(node.value + delta))
        elif isinstance(node, ast.Constant) and id(node) in compared_strings:
            yield _Site("string", node, lambda node=node: ast.Constant(f"{node.value}__mutant" if node.value else "__mutant"))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2 and all(_constant_like(e) for e in node.elts):
            for i in range(len(node.elts)):
                def drop(node=node, i=i):
                    mutated = copy.deepcopy(node)
                    del mutated.elts[i]
                    return mutated
                yield _Site("drop", node, drop)
        elif isinstance(node, ast.Dict) and len(node.keys) >= 2 and all(k is not None and _constant_like(k) for k in node.keys):
            for i in range(len(node.keys)):
                def drop_entry(node=node, i=i):
                    mutated = copy.deepcopy(node)
                    del mutated.keys[i], mutated.values[i]
                    return mutated
                yield _Site("drop", node, drop_entry)
        elif isinstance(node, ast.Return) and node.value is not None and id(node) not in generator_returns:
            value = node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, bool):
                yield _Site("return", node, lambda value=value: ast.Return(ast.Constant(not value.value)))
            elif not (isinstance(value, ast.Constant) and value.value is None):
                yield _Site("return", node, lambda: ast.Return(ast.Constant(None)))
        elif isinstance(node, ast.Expr) and isinstance(node.value, (ast.Yield, ast.YieldFrom)):
            yield _Site("yield", node, lambda: None)
        elif isinstance(node, ast.Continue):
            yield _Site("continue", node, lambda: ast.Break())
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            other = ast.Sub if isinstance(node.op, ast.Add) else ast.Add
            yield _Site("arith", node, lambda node=node, other=other: ast.BinOp(copy.deepcopy(node.left), other(), copy.deepcopy(node.right)))
        tests = []
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            tests.append((node, "test"))
        elif isinstance(node, ast.comprehension):
            tests += [(node, i) for i in range(len(node.ifs))]
        for holder, where in tests:
            test = holder.test if where == "test" else holder.ifs[where]
            if not (isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)):
                yield _Site("negate", test, lambda test=test: ast.UnaryOp(ast.Not(), copy.deepcopy(test)))


def _parents(tree: ast.AST) -> dict[int, tuple[ast.AST, str, int | None]]:
    parents = {}
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if isinstance(value, list):
                for i, child in enumerate(value):
                    if isinstance(child, ast.AST):
                        parents[id(child)] = (parent, field, i)
            elif isinstance(value, ast.AST):
                parents[id(value)] = (parent, field, None)
    return parents


def _short(node: ast.AST, width: int = 110) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _ordered(tree: ast.AST) -> list[_Site]:
    """Sites numbered in source order (a stable sort keeps walk order within one position)."""
    return sorted(_sites(tree), key=lambda s: (getattr(s.node, "lineno", 0), getattr(s.node, "col_offset", 0)))


def mutants(source_text: str) -> list[Mutant]:
    tree = ast.parse(source_text)
    found = []
    for i, site in enumerate(_ordered(tree)):
        after = site.replacement()
        found.append(Mutant(i, site.operator, getattr(site.node, "lineno", 0), _short(site.node), _short(after) if after else "pass"))
    return found


def mutated_tree(source_text: str, index: int) -> ast.Module:
    tree = ast.parse(source_text)
    parents = _parents(tree)
    for i, site in enumerate(_ordered(tree)):
        if i != index:
            continue
        new = site.replacement() or ast.Pass()
        parent, field, position = parents[id(site.node)]
        if position is None:
            setattr(parent, field, new)
        else:
            getattr(parent, field)[position] = new
        ast.copy_location(new, site.node)
        return ast.fix_missing_locations(tree)
    raise IndexError(f"no mutant {index}")


# --------------------------------------------------------------------------- the import hook (in the test process)


class _MutantFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, name: str, path: Path, index: int):
        self.name, self.path, self.index = name, path, index

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        spec = importlib.util.spec_from_loader(fullname, self, origin=str(self.path))
        spec.has_location = True
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__file__ = str(self.path)
        tree = mutated_tree(self.path.read_text(), self.index)
        exec(compile(tree, str(self.path), "exec"), module.__dict__)


def _install_hook() -> None:
    short, _, index = os.environ[ENV].rpartition(":")
    source = MODULES[short][0] if short in MODULES else short  # a custom --module is named by its source
    sys.meta_path.insert(0, _MutantFinder(module_name(source), REPO / source, int(index)))


if os.environ.get(ENV) and __name__ != "__main__":
    _install_hook()


def pytest_sessionfinish(session, exitstatus) -> None:
    if finished := os.environ.get(FINISHED):
        Path(finished).write_text(str(int(exitstatus)))


# --------------------------------------------------------------------------- the runner


@dataclass(frozen=True)
class Result:
    mutant: Mutant
    outcome: str  # killed, survived, timeout
    seconds: float


RUNNING: set[subprocess.Popen] = set()
"""Test processes under way, ended at once on Ctrl-C (each runs in a session of its own)."""


def _pytest(short: str, index: int | None, timeout: float) -> tuple[str, float]:
    with tempfile.TemporaryDirectory() as directory:
        finished = Path(directory) / "finished"
        outcome, seconds = _run_pytest(short, index, timeout, finished)
        if outcome == "survived" and not (finished.is_file() and finished.read_text() == "0"):
            outcome = "killed"  # the test process ended (os._exit, a signal) before pytest finished
        return outcome, seconds


def _run_pytest(short: str, index: int | None, timeout: float, finished: Path) -> tuple[str, float]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env[FINISHED] = str(finished)
    if index is not None:
        env[ENV] = f"{short}:{index}"
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "benchmarks.mutation", *MODULES[short][1]]
    start = time.monotonic()
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    RUNNING.add(process)
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end(process)
        return "timeout", time.monotonic() - start
    finally:
        RUNNING.discard(process)
    if code == 5:
        raise SystemExit(f"{short}: pytest collected no test from {', '.join(MODULES[short][1])}")
    if code < 0:
        raise KeyboardInterrupt  # ended by the interrupt handler
    return ("survived" if code == 0 else "killed"), time.monotonic() - start


def _end(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def select(short: str, args: argparse.Namespace) -> tuple[list[Mutant], int]:
    """The mutants of a module to run, and how many it has."""
    every = mutants((REPO / MODULES[short][0]).read_text())
    if args.index:
        return [m for m in every if m.index in args.index], len(every)
    chosen = [m for m in every if m.operator in args.operators]
    if args.limit and len(chosen) > args.limit:
        chosen = sorted(random.Random(f"{args.seed}:{short}").sample(chosen, args.limit), key=lambda m: m.index)
    return chosen, len(every)


def run_module(short: str, args: argparse.Namespace, results: list[Result]) -> None:
    source, tests = MODULES[short]
    chosen, total = select(short, args)
    outcome, seconds = _pytest(short, None, args.timeout or 600)
    if outcome != "survived":
        raise SystemExit(f"{short}: the unmutated tests fail ({' '.join(tests)}); fix them first")
    timeout = args.timeout or max(60.0, 4 * seconds)
    print(f"{short}: {len(chosen)} of {total} mutants, tests {' '.join(tests)} ({seconds:.0f} s unmutated)", flush=True)

    original = (REPO / source).read_text()

    def one(m: Mutant) -> None:
        outcome, seconds = _pytest(short, m.index, timeout)
        if (REPO / source).read_text() != original:
            raise SystemExit(f"{source} changed during the run: mutant numbers no longer match; run again")
        results.append(Result(m, outcome, seconds))
        print(f"  {len(results)}/{len(chosen)} #{m.index} {source}:{m.line} [{m.operator}] {outcome} ({seconds:.0f} s)", flush=True)

    pool = ThreadPoolExecutor(max_workers=args.jobs)
    futures = [pool.submit(one, m) for m in chosen]
    try:
        for future in futures:
            future.result()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        for process in list(RUNNING):
            _end(process)
        raise
    pool.shutdown()


def report(all_results: dict[str, list[Result]]) -> None:
    print()
    for short, results in all_results.items():
        if not results:
            continue
        killed = sum(r.outcome != "survived" for r in results)
        print(f"{short:<11} {MODULES[short][0]:<40} {killed:>4}/{len(results):<4} killed  {100 * killed / len(results):5.1f}%")
    for short, results in all_results.items():
        survivors = sorted((r.mutant for r in results if r.outcome == "survived"), key=lambda m: m.index)
        if survivors:
            print(f"\nsurvivors in {MODULES[short][0]}:")
            for m in survivors:
                print(f"  #{m.index} {MODULES[short][0]}:{m.line} [{m.operator}] {m.before}  ->  {m.after}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--module",
        action="append",
        type=module_spec,
        help=f"a module to mutate (repeatable; default: all): one of {', '.join(sorted(MODULES))}, or any source "
        "file with the tests that exercise it, SOURCE=TEST[,TEST...] (components/health.py=tests/test_health.py)",
    )
    parser.add_argument("--seed", default="0", help="seed of the sample --limit draws (default 0)")
    parser.add_argument("--limit", type=int, default=0, help="mutants per module, drawn at random (default: every one)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run side by side (default 1)")
    parser.add_argument("--operators", type=lambda s: tuple(s.split(",")), default=OPERATORS, help=f"comma list of {','.join(OPERATORS)}")
    parser.add_argument("--index", type=lambda s: {int(i) for i in s.split(",")}, default=None, help="run these mutant numbers only")
    parser.add_argument("--timeout", type=float, default=0, help="seconds per mutant (default: 4x the unmutated run, at least 60)")
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    args = parser.parse_args(argv)
    unknown = set(args.operators) - set(OPERATORS)
    if unknown:
        parser.error(f"unknown operator(s) {', '.join(sorted(unknown))}")
    if args.list:
        for short in args.module or list(MODULES):
            for m in select(short, args)[0]:
                print(f"{short}#{m.index} {MODULES[short][0]}:{m.line} [{m.operator}] {m.before}  ->  {m.after}")
        return 0
    all_results: dict[str, list[Result]] = {}
    try:
        for short in args.module or list(MODULES):
            run_module(short, args, all_results.setdefault(short, []))
    except KeyboardInterrupt:
        print("\ninterrupted: figures so far (no file was changed)")
    report(all_results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
