"""What the report says in words, shared by performance.md and index.html: the engine
fallbacks, the assumptions a prediction rests on, and why the counts are what they are."""

from compiler.plan import Plan

FALLBACK_SOURCES = ("rule:engine-capability", "rule:host-memory")
MAX_PATHS = 3


def _grouped(plan: Plan, keep) -> list[list[str]]:
    """[plan paths, value, source, why] per distinct decision that `keep` admits."""
    rows: dict[tuple[str, str, str], list[str]] = {}
    for d in plan.decisions:
        if keep(d):
            rows.setdefault((d.value, d.source, d.why), []).append(d.path)
    out = []
    for (value, source, why), paths in rows.items():
        shown = ", ".join(paths[:MAX_PATHS]) + (f" (+{len(paths) - MAX_PATHS})"
                                                if len(paths) > MAX_PATHS else "")
        out.append([shown, value, source, why])
    return out


def fallbacks(plan: Plan) -> list[list[str]]:
    """Where the plan departs from the usual layout because the engines (or the tray's host
    memory) cannot do more."""
    return _grouped(plan, lambda d: d.source in FALLBACK_SOURCES)


def assumptions(plan: Plan) -> list[list[str]]:
    """Decisions resting on a value no public source gives (the catalog marks it `assumed`)."""
    return _grouped(plan, lambda d: d.source not in FALLBACK_SOURCES
                    and "assumed" in d.why.lower())


def balance_sentence(b: dict | None) -> str:
    """Why the counts (compiler/balance.py): the binding role and what the spare buys."""
    if not b:
        return ""
    bind = b["binding_role"]
    other = "prefill" if bind == "decode" else "decode"
    instead = b["one_more_binding_instance_goodput"]
    more = (f"would leave GPUs for only {instead:g} requests/s of {other}" if instead
            else f"would leave no GPUs for {other}")
    return (f"Goodput is bound by {bind}: its instances sustain "
            f"{b['binding_supply_requests_per_s']:g} requests/s at the SLO. One more {bind} "
            f"instance {more}, so the rest of the GPUs serve {other}; of its instances "
            f"{b[f'{other}_instances_needed']} carry the goodput and "
            f"{b[f'{other}_instances_spare']} are spare.")
