"""The benchmark's targets: read from targets.yaml (data), evaluated on one run's tables."""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping, Sequence
from pathlib import Path

TARGETS_FILE = Path(__file__).with_name("targets.yaml")
# In a `where` filter, this value stands for the largest value of that field in the table.
TOP = "top"
_PICKS = {"max": max, "min": min}
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


class TargetError(ValueError):
    """A target in targets.yaml is malformed (not: a target was missed)."""


def load_targets(path: Path = TARGETS_FILE) -> list[dict]:
    import yaml

    targets = yaml.safe_load(Path(path).read_text())["targets"]
    for target in targets:
        missing = {"name", "select", "measured", "goal"} - set(target)
        if missing:
            raise TargetError(f"target {target.get('name', target)!r} lacks {sorted(missing)}")
        evaluate_expression(target["measured"], dict.fromkeys(target["select"], 1.0))  # names and syntax
    return targets


def evaluate_expression(expression: str, names: Mapping[str, float]) -> float:
    """+ - * / over numbers and the given names; nothing else is evaluated."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.Name) and node.id in names:
            return float(names[node.id])
        raise TargetError(f"unsupported term {ast.dump(node)} in {expression!r}")

    return value(ast.parse(str(expression), mode="eval").body)


def select(tables: Mapping[str, Sequence[Mapping]], spec: Mapping) -> float | None:
    """One figure: the `field` of the rows of `table` matching `where`, reduced by `pick`; None if no row."""
    rows = tables[spec["table"]]
    where = dict(spec.get("where", {}))
    for key, wanted in where.items():
        if wanted == TOP:
            present = [row[key] for row in rows if key in row]
            where[key] = max(present) if present else None
    matching = [row[spec["field"]] for row in rows if all(row.get(k) == v for k, v in where.items())]
    if not matching:
        return None
    pick = spec.get("pick", "only")
    if pick == "only":
        if len(matching) != 1:
            raise TargetError(f"{spec} matches {len(matching)} rows; narrow `where` or pick max/min")
        return float(matching[0])
    return float(_PICKS[pick](matching))


def targets_for(device: str, targets: Sequence[Mapping]) -> list[Mapping]:
    """The targets a run on `device` is held to: those naming no device, and those naming this one."""
    return [target for target in targets if target.get("device") in (None, device)]


def evaluate_targets(report: Mapping, targets: Sequence[Mapping] | None = None) -> list[dict]:
    """Each target for the run's device with its measured value and whether it was met (met is None when
    not measured)."""
    tables = {"served": report["served"], "ceilings": report["ceilings"]}
    results = []
    for target in targets_for(
        report.get("settings", {}).get("device", "cpu"), load_targets() if targets is None else targets
    ):
        figures = {name: select(tables, spec) for name, spec in target["select"].items()}
        result = {
            "target": target["name"],
            "goal": float(target["goal"]),
            "lower_is_better": bool(target.get("lower_is_better", False)),
            "unit": target.get("unit", "x"),
            "figures": figures,
            "measured": None,
            "met": None,
        }
        if all(value is not None for value in figures.values()):
            measured = evaluate_expression(target["measured"], figures)
            goal = result["goal"]
            result["measured"] = measured
            result["met"] = measured <= goal if result["lower_is_better"] else measured >= goal
        results.append(result)
    return results
