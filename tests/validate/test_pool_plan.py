"""pool-matches-plan: the Mooncake client files register the plan's segments over its HCAs."""

import json

from compiler.validate import rules

from .bundles import HGX, VR, compiled

RULE = "pool-matches-plan"


def _client(files) -> str:
    return next(p for p in sorted(files) if p.startswith("mooncake/clients/"))


def _change(files, path: str, **fields) -> None:
    doc = json.loads(files[path])
    doc.update(fields)
    files[path] = json.dumps(doc, indent=2)


def test_the_compiled_examples_match_their_plans():
    for name in (VR, HGX):
        plan, files = compiled(name)
        assert plan.kv_pool.enabled and _client(files)
        assert not rules.findings(plan, files, [RULE])


def test_a_client_on_other_hcas_than_the_sites_is_named():
    """S3-17: the site's HCAs (here: none named, so discovery) and the client file's differ."""
    plan, files = compiled(VR)
    path = _client(files)
    _change(files, path, device_name="mlx5_0")
    [f] = rules.findings(plan, files, [RULE])
    assert f.file == path and "device_name" in f.where and "mlx5_0" in f.got


def test_a_segment_other_than_the_plans_and_a_missing_client_are_named():
    plan, files = compiled(VR)
    first, *rest = sorted(p for p in files if p.startswith("mooncake/clients/"))
    _change(files, first, global_segment_size=1)
    del files[rest[0]]
    found = rules.findings(plan, files, [RULE])
    assert {(f.file, f.got) for f in found} >= {(first, "1"), (rest[0], "missing")}
