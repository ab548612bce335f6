"""Mutants of one function's source: small, realistic edits of the kind a learner gets wrong.

Each mutant is the whole function with exactly one change, as source text in the learner's format
(a top-level `def`, what `judge.stubs.reference_source` gives), so the judge can swap it in like a
learner's answer. The operators, by the mistake they stand for:

    op        mistake                                   example
    arith     wrong operator, or a term left out        a + b -> a - b,  x * w -> x
    compare   boundary or sense of a comparison         < -> <=,  == -> !=,  is -> is not
    logic     and/or mixed up, a condition left out     a and b -> a or b,  a and b -> a
    negate    a condition the wrong way round           if c: -> if not c:
    const     an off-by-one or wrong constant           1 -> 0, 1 -> 2,  True -> False
    length    off by one on a length or a bound          len(x) -> len(x) - 1,  x[:n] -> x[:n + 1]
    dtype     the wrong dtype, or a cast left out       float32 -> bfloat16,  x.float() -> x
    kwarg     a keyword argument left out               f(x, keepdim=True) -> f(x)
    args      two arguments swapped                     f(a, b) -> f(b, a)
    call      the other builtin                         min -> max,  any -> all
    drop      a statement left out                      self.free(slot) -> pass
    swap      two statements in the wrong order         a; b -> b; a
    flow      the other loop exit                       break -> continue

A mutant's id is `<op>-<8 hex digits of the hash of its code>` (docstring left out): stable while
the reference's code does not change, and new when it does (so a recorded equivalent mutant goes
stale, and the tool says so).
"""

from __future__ import annotations

import ast
import copy
import difflib
import hashlib
from dataclasses import dataclass
from typing import Callable, Iterator, List, Tuple

ARITH = {
    ast.Add: [ast.Sub],
    ast.Sub: [ast.Add],
    ast.Mult: [ast.Div],
    ast.Div: [ast.Mult, ast.FloorDiv],
    ast.FloorDiv: [ast.Div, ast.Mult],
    ast.Mod: [ast.FloorDiv],
    ast.Pow: [ast.Mult],
    ast.LShift: [ast.RShift],
    ast.RShift: [ast.LShift],
    ast.BitAnd: [ast.BitOr],
    ast.BitOr: [ast.BitAnd],
}
COMPARE = {
    ast.Lt: [ast.LtE],
    ast.LtE: [ast.Lt],
    ast.Gt: [ast.GtE],
    ast.GtE: [ast.Gt],
    ast.Eq: [ast.NotEq],
    ast.NotEq: [ast.Eq],
    ast.Is: [ast.IsNot],
    ast.IsNot: [ast.Is],
    ast.In: [ast.NotIn],
    ast.NotIn: [ast.In],
}
DTYPES = {
    "float32": ["bfloat16"],
    "float": ["bfloat16"],
    "bfloat16": ["float32"],
    "float16": ["float32"],
    "half": ["float32"],
    "int64": ["int32"],
    "long": ["int32"],
    "int32": ["int64"],
    "int": ["int64"],
}
CASTS = {"float", "to", "long", "int", "contiguous", "clone", "detach", "cpu", "type_as"}
BUILTIN_SWAPS = {"min": "max", "max": "min", "any": "all", "all": "any"}


@dataclass(frozen=True)
class Mutant:
    id: str
    op: str
    line: int  # in the function's source, 1-based
    description: str  # "line 4: x32.float() -> x32"
    source: str  # the whole mutated function

    def diff(self, original: str) -> str:
        lines = difflib.unified_diff(
            _normal(original).splitlines(),
            self.source.splitlines(),
            "reference",
            self.id,
            n=1,
            lineterm="",
        )
        return "\n".join(list(lines)[2:])


def mutants(source: str, name: str) -> List[Mutant]:
    """Every mutant of the function `name` defined in `source`, each once, in source order."""
    tree = ast.parse(source)
    original = _normal(source)
    seen = {original}
    out: List[Mutant] = []
    for op, line, before, apply in _sites(tree, name):
        mutated = copy.deepcopy(tree)
        after = apply(_func(mutated, name))
        try:
            text = ast.unparse(ast.fix_missing_locations(mutated))
            compile(text, "<mutant>", "exec")
        except (SyntaxError, ValueError, TypeError):
            continue
        if text in seen:
            continue
        seen.add(text)
        digest = hashlib.sha1(_without_docstring(mutated, name).encode()).hexdigest()[:8]
        out.append(
            Mutant(f"{op}-{digest}", op, line, f"line {line}: {before} -> {after}", text + "\n")
        )
    return out


def _without_docstring(tree: ast.Module, name: str) -> str:
    """The function's code alone: ids survive edits of its docstring (the stub's contract)."""
    func = copy.deepcopy(_func(tree, name))
    if _is_docstring(func.body[0]) and len(func.body) > 1:
        func.body = func.body[1:]
    return ast.unparse(func)


def _normal(source: str) -> str:
    return ast.unparse(ast.parse(source))


def _func(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise LookupError(f"no def {name} in the source")


# A site: (op, line, the original text, a function that applies the change to the same spot of a
# copy of the tree and returns the new text). Sites are found on the original tree by position in
# a deterministic walk; `apply` walks the copy the same way to find its twin node.
Site = Tuple[str, int, str, Callable[[ast.FunctionDef], str]]


def _walk(func: ast.FunctionDef) -> List[ast.AST]:
    """The function body's nodes in a fixed order, without the docstring and annotations."""
    body = func.body[1:] if _is_docstring(func.body[0]) else func.body
    out: List[ast.AST] = []

    def visit(node: ast.AST) -> None:
        out.append(node)
        for field, value in ast.iter_fields(node):
            if field in ("annotation", "returns", "type_comment", "decorator_list"):
                continue
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    visit(child)

    for stmt in body:
        visit(stmt)
    return out


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _sites(tree: ast.Module, name: str) -> Iterator[Site]:
    func = _func(tree, name)
    nodes = _walk(func)
    parents = {id(child): node for node in nodes for child in ast.iter_child_nodes(node)}
    for i, node in enumerate(nodes):
        yield from _expression_sites(i, node, parents.get(id(node)), name)
    for i, node in enumerate(nodes):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield from _block_sites(i, field, block, name)
    top = func.body[1:] if _is_docstring(func.body[0]) else func.body
    yield from _block_sites(None, "body", top, name)


def _at(i: int, name: str) -> Callable[[ast.FunctionDef], ast.AST]:
    return lambda f: _walk(f)[i]


def _replace_in_parent(func: ast.FunctionDef, old: ast.AST, new: ast.AST) -> None:
    for node in ast.walk(func):
        for field, value in ast.iter_fields(node):
            if value is old:
                setattr(node, field, new)
                return
            if isinstance(value, list):
                for j, child in enumerate(value):
                    if child is old:
                        value[j] = new
                        return
    raise LookupError("node not found")


def _text(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


def _expression_sites(i: int, node: ast.AST, parent: ast.AST | None, name: str) -> Iterator[Site]:
    get = _at(i, name)
    line = getattr(node, "lineno", 0)

    def swap_with(make: Callable[[ast.AST], ast.AST]) -> Callable[[ast.FunctionDef], str]:
        def apply(f: ast.FunctionDef) -> str:
            old = get(f)
            new = make(copy.deepcopy(old))
            _replace_in_parent(f, old, new)
            return _text(new)

        return apply

    def mutate(change: Callable[[ast.AST], None]) -> Callable[[ast.FunctionDef], str]:
        def apply(f: ast.FunctionDef) -> str:
            target = get(f)
            change(target)
            return _text(target)

        return apply

    if isinstance(node, ast.BinOp):
        for new_op in ARITH.get(type(node.op), []):
            yield "arith", line, _text(node), mutate(lambda n, o=new_op: setattr(n, "op", o()))
        if isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            yield "arith", line, _text(node), swap_with(lambda n: n.left)
            if isinstance(node.op, (ast.Add, ast.Mult)):
                yield "arith", line, _text(node), swap_with(lambda n: n.right)
    elif isinstance(node, ast.AugAssign):
        for new_op in ARITH.get(type(node.op), []):
            yield "arith", line, _text(node), mutate(lambda n, o=new_op: setattr(n, "op", o()))
    elif isinstance(node, ast.Compare):
        for k, cmp in enumerate(node.ops):
            for new_op in COMPARE.get(type(cmp), []):

                def change(n, k=k, o=new_op):
                    n.ops[k] = o()

                yield "compare", line, _text(node), mutate(change)
    elif isinstance(node, ast.BoolOp):
        other = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield "logic", line, _text(node), mutate(lambda n: setattr(n, "op", other()))
        for k in range(len(node.values)):

            def drop(n, k=k):
                rest = [v for j, v in enumerate(n.values) if j != k]
                return rest[0] if len(rest) == 1 else ast.BoolOp(op=n.op, values=rest)

            yield "logic", line, _text(node), swap_with(drop)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        if not (isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant)):
            yield "negate", line, _text(node), swap_with(lambda n: n.operand)
    elif isinstance(node, ast.Constant) and not isinstance(parent, ast.JoinedStr):
        value = node.value
        if isinstance(value, bool):
            yield "const", line, _text(node), mutate(lambda n: setattr(n, "value", not n.value))
        elif isinstance(value, int):
            for new in sorted({value + 1, value - 1} - {value}):
                if new >= 0 or value < 0 or isinstance(parent, ast.UnaryOp):
                    yield (
                        "const",
                        line,
                        _text(node),
                        mutate(lambda n, v=new: setattr(n, "value", v)),
                    )
        elif isinstance(value, float):
            new = 0.0 if value != 0 else 1.0
            yield "const", line, _text(node), mutate(lambda n, v=new: setattr(n, "value", v))
    elif (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "torch"
    ):
        for new in DTYPES.get(node.attr, []):
            yield "dtype", line, _text(node), mutate(lambda n, a=new: setattr(n, "attr", a))

    if isinstance(node, (ast.If, ast.IfExp)):

        def negate(n):
            n.test = ast.UnaryOp(op=ast.Not(), operand=n.test)

        yield "negate", line, "if " + _text(node.test), mutate(negate)
    if isinstance(node, ast.Call):
        yield from _call_sites(node, line, swap_with, mutate)
    if isinstance(node, ast.Slice):
        for bound in ("lower", "upper"):
            if getattr(node, bound) is not None:
                for op in (ast.Add, ast.Sub):

                    def change(n, b=bound, o=op):
                        setattr(n, b, ast.BinOp(left=getattr(n, b), op=o(), right=ast.Constant(1)))

                    yield "length", line, _text(node), mutate(change)
    if isinstance(node, ast.Break):
        yield "flow", line, "break", swap_with(lambda n: ast.Continue())
    elif isinstance(node, ast.Continue):
        yield "flow", line, "continue", swap_with(lambda n: ast.Break())


def _call_sites(node: ast.Call, line: int, swap_with, mutate) -> Iterator[Site]:
    func = node.func
    if isinstance(func, ast.Name) and func.id == "len":
        for op in (ast.Add, ast.Sub):
            yield (
                "length",
                line,
                _text(node),
                swap_with(lambda n, o=op: ast.BinOp(left=n, op=o(), right=ast.Constant(1))),
            )
    if isinstance(func, ast.Name) and func.id in BUILTIN_SWAPS:
        yield (
            "call",
            line,
            _text(node),
            mutate(lambda n: setattr(n.func, "id", BUILTIN_SWAPS[n.func.id])),
        )
    if isinstance(func, ast.Attribute) and func.attr in CASTS:
        yield "dtype", line, _text(node), swap_with(lambda n: n.func.value)
    for k, kw in enumerate(node.keywords):
        if kw.arg is None:
            continue

        def drop(n, k=k):
            del n.keywords[k]

        yield "kwarg", line, _text(node), mutate(drop)
    positional = [a for a in node.args if not isinstance(a, ast.Starred)]
    if len(positional) >= 2 and len(positional) == len(node.args):

        def swap(n):
            n.args[0], n.args[1] = n.args[1], n.args[0]

        if ast.dump(node.args[0]) != ast.dump(node.args[1]):
            yield "args", line, _text(node), mutate(swap)


def _block_sites(i: int | None, field: str, block: List[ast.stmt], name: str) -> Iterator[Site]:
    """Statement-level mutants of one block: each statement left out, each pair of neighbours
    swapped. `i` is the block owner's position in the walk (None: the function body itself)."""

    def block_of(f: ast.FunctionDef) -> List[ast.stmt]:
        if i is None:
            return f.body
        return getattr(_walk(f)[i], field)

    for k, stmt in enumerate(block):
        if _is_docstring(stmt) or isinstance(stmt, ast.Pass):
            continue

        def drop(f, k=k):
            b = block_of(f)
            real = k + (1 if i is None and _is_docstring(f.body[0]) else 0)
            old = b[real]
            b[real] = ast.Pass()
            return "pass  # was: " + _text(old).splitlines()[0]

        yield "drop", stmt.lineno, _text(stmt).splitlines()[0], drop
        if k + 1 < len(block) and not _is_terminal(stmt):

            def swap(f, k=k):
                b = block_of(f)
                real = k + (1 if i is None and _is_docstring(f.body[0]) else 0)
                b[real], b[real + 1] = b[real + 1], b[real]
                return "the next statement first"

            yield "swap", stmt.lineno, _text(stmt).splitlines()[0], swap


def _is_terminal(stmt: ast.stmt) -> bool:
    return isinstance(stmt, (ast.Return, ast.Raise, ast.Break, ast.Continue))
