"""compiler.plan: the lookups a plan indexes once (instance, tray, Engram groups) answer for
the plan's own fields, also on a copy made with other ones."""

from pathlib import Path

from compiler.plan import load_plan

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "vr-nvl72-deepseek-v4.1-flash"


def test_a_copy_with_other_fields_answers_from_them_not_from_the_originals_lookups():
    plan = load_plan((GOLDEN / "plan" / "plan.yaml").read_text())
    first = plan.instances[0]
    gpus = first.gpus
    assert plan.instance(first.id) == first and plan.engram_groups(gpus) == {first.id}
    edited = first.model_copy(update={"max_batch": first.max_batch + 1})
    copy = plan.model_copy(update={"instances": [edited, *plan.instances[1:]],
                                   "engram_shards": []})
    assert copy.instance(first.id) == edited and copy.engram_groups(gpus) == set()
    assert plan.instance(first.id) == first and plan.engram_groups(gpus) == {first.id}
