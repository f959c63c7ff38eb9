"""tenants is the bottom of the control plane: adapters, schemas, the gateway and the console build on it, so no
module of tenants imports them, at the top or inside a function (an import hidden in a function is still a cycle)."""

import ast
from pathlib import Path

import tenants

ABOVE = {"adapters", "console", "gateway", "schemas"}
PACKAGE = Path(tenants.__file__).parent


def imports_from_above(source: str) -> list[tuple[int, str]]:
    """(line, module) of every absolute import of a package in ABOVE, however deeply nested."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.partition(".")[0] in ABOVE]
    return found


def test_no_module_of_tenants_imports_a_package_built_on_it():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 30  # the walk found the package
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
                 for path in modules for line, name in imports_from_above(path.read_text())]
    assert offenders == []


def test_imports_inside_functions_are_found_too():
    source = "import tenants.models\n\ndef f():\n    from gateway.db import x\n    if x:\n        import adapters.refs"
    assert imports_from_above(source) == [(4, "gateway.db"), (6, "adapters.refs")]
