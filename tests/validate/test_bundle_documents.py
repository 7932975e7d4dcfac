"""The compile-time bundle rules read the objects the targets dumped (compiler.documents)
instead of parsing the text back: that must be exactly what parsing the written text gives,
object for object, line for line, finding for finding."""

import copy
import pickle

import pytest

from compiler.documents import Documents
from compiler.validate import bundle, rules
from targets._yaml import dump_documents
from tests.validate.bundles import EXAMPLE_NAMES, HGX_PP, VR, compiled

CASES = (*EXAMPLE_NAMES, HGX_PP)


def _plain(files: dict) -> dict:
    return {k: str(v) if isinstance(v, str) else v for k, v in files.items()}


def _paths(doc: dict) -> list[str]:
    """A few field paths of an object, nested ones included, for `line_at`."""
    out = ["metadata.name", "spec"]
    spec = doc.get("spec") or {}
    out += [f"spec.components[{i}].podTemplate.spec"
            for i in range(len(spec.get("components") or []))]
    if "template" in spec:
        out.append("spec.template.spec.containers[0]")
    return out


@pytest.mark.parametrize("case", CASES)
def test_the_dumped_objects_are_what_the_text_parses_to(case: str):
    _, files = compiled(case)
    objects = [o for folder in bundle.BUNDLES for o in bundle.objects(files, folder)]
    assert all(isinstance(files[o.file], Documents) for o in objects)
    for folder in bundle.BUNDLES:
        carried = bundle.objects(files, folder)
        parsed = bundle.objects(_plain(files), folder)
        # repr: key order and types too (a tuple is not a list, True is not 1)
        assert [(o.file, o.line, repr(o.doc)) for o in carried] == \
            [(o.file, o.line, repr(o.doc)) for o in parsed]
        for a, b in zip(carried, parsed, strict=True):
            assert [a.line_at(p) for p in _paths(a.doc)] == [b.line_at(p) for p in _paths(b.doc)]


@pytest.mark.parametrize("case", CASES)
def test_the_rules_find_the_same_either_way(case: str):
    plan, files = compiled(case)
    assert rules.findings(plan, files) == rules.findings(plan, _plain(files))


def test_a_broken_bundle_is_found_the_same_either_way():
    """A defect planted in the objects (a nodeSelector no tray has, its keys unsorted) gives
    the same findings, word for word, from the carried objects as from the written text."""
    plan, files = compiled(VR)
    path = "lws/leaderworkersets.yaml"
    docs = copy.deepcopy(list(files[path].docs))
    lws = next(d for d in docs if d["kind"] == "LeaderWorkerSet")
    spec = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    spec["nodeSelector"] = {"zz.example/tier": "1", "aa.example/tier": "2"}
    files[path] = dump_documents(docs)
    found = rules.findings(plan, files)
    assert found and found == rules.findings(plan, _plain(files))


def test_documents_pickle_with_their_data():
    """The emitter process sends its files to the compile over a pipe."""
    text = Documents(["a: 1\n", "b:\n- 2\n"], [{"a": 1}, {"b": [2]}])
    back = pickle.loads(pickle.dumps(text))
    assert (back, back.docs, back.lines, type(back)) == \
        ("a: 1\n---\nb:\n- 2\n", ({"a": 1}, {"b": [2]}), (1, 3), Documents)
