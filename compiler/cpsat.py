"""OR-Tools' CP-SAT module without pandas: `from compiler.cpsat import cp_model`.

`ortools.sat.python.cp_model` imports pandas at module level (OR-Tools 9.15: 0.4-0.6 CPU s,
more than the solve itself on the examples) for its Series-based helpers only
(`new_int_var_series`, `new_*_interval_var_series`, `CpSolver.values` of a Series), which
rackc never calls; what it does call (`CpModel`, `CpSolver`, `LinearExpr`, the status codes)
never touches pandas. So while cp_model is first imported, `pandas` in `sys.modules` is a
module that holds two classes nothing is an instance of (`Index`, `Series`: the names
cp_model's annotations and `isinstance` checks read), and it is removed again right after:
any later `import pandas` loads the real one. A Series helper called by mistake fails loudly
(cp_model raises TypeError: "index must be a pd.Index"). Where pandas is already loaded (a
test session, a notebook), cp_model gets the real one.
"""

import sys
import types


def _cp_model() -> types.ModuleType:
    if "pandas" in sys.modules or "ortools.sat.python.cp_model" in sys.modules:
        from ortools.sat.python import cp_model

        return cp_model
    absent = types.ModuleType("pandas", "not loaded: cp_model's Series helpers are unused")

    class Index:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise TypeError("pandas is not loaded (compiler.cpsat)")

    class Series(Index):
        pass

    absent.Index, absent.Series = Index, Series
    sys.modules["pandas"] = absent
    try:
        from ortools.sat.python import cp_model
    finally:
        if sys.modules.get("pandas") is absent:
            del sys.modules["pandas"]
    return cp_model


cp_model = _cp_model()
